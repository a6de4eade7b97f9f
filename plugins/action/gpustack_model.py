# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for kvpin.fleet.gpustack_model: on the controller, in its own process.

The module only talks HTTP to the GPUStack server, and site.yml runs it on the controller
(delegate_to: localhost) once per deployment. Started as a module, each run is a new Python
process that imports Ansible's module code before its first request; on a fleet that is most
of a rerun's models phase. So when the task runs on the controller as the controller's user,
with no task environment, this plugin runs the module's own function
(module_utils/gpustack_model_apply.py) here, after the module's own argument validation, and
masks the API key in its result as AnsibleModule would. Anywhere else (another host, become,
an ``environment:``, async) the module runs as usual.
"""


import json

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.parameters import remove_values
from ansible.plugins.action import ActionBase

from ansible_collections.kvpin.fleet.plugins.plugin_utils.module_run import module_would_return_invocation, run_module_as_usual
from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.model_apply import (
    gpustack_model_argument_spec, gpustack_model_result,
)

MODULE_NAME = 'kvpin.fleet.gpustack_model'


class ActionModule(ActionBase):

    _supports_check_mode = True
    _supports_async = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        if not self._runs_in_this_process():
            result.update(run_module_as_usual(self, MODULE_NAME, task_vars))
            return result

        # The module's own argument validation (AnsibleModule runs the same validator): same
        # coercion, same fallbacks, same messages; its no_log values are masked in everything.
        validation = ArgumentSpecValidator(gpustack_model_argument_spec()).validate(dict(self._task.args))
        secrets = set(validation._no_log_values)
        if validation.error_messages:
            result.update(failed=True, msg=remove_values(validation.error_messages[0], secrets))
            return result
        params = validation.validated_parameters
        answer = gpustack_model_result(params, check_mode=bool(self._task.check_mode), diff=bool(self._task.diff),
                                       keys_to_mask=secrets)
        if module_would_return_invocation(task_vars):
            answer['invocation'] = dict(module_args=params)
        answer['changed'] = bool(answer.get('changed', False))
        # Through JSON as a module's result comes back, then every secret masked (the key as
        # given and as sent, wherever a server echoed it), as AnsibleModule.exit_json does.
        result.update(remove_values(json.loads(json.dumps(answer)), secrets))
        return result

    def _runs_in_this_process(self):
        """True when running the module would start a Python on this machine as this user with
        this process's environment: then the function runs here instead."""
        if self._task.async_val or self._play_context.become:
            return False
        if getattr(self._connection, 'transport', None) != 'local':
            return False
        environment = {}
        self._compute_environment_string(environment)
        return not environment
