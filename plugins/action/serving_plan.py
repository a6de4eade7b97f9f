# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for kvpin.fleet.serving_plan: plans on the controller unless the model's
files are on the node.

The plan is arithmetic over the GPU facts and the model, so for a catalog name, repo id
or HF config dict there is nothing to fetch from the node and no reason to copy the
module there and run it (one remote round trip per deployment per node). A model given
as a path is read where it is, so then the module runs on the node as usual.
"""


import json

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.kvpin.fleet.plugins.plugin_utils.module_run import module_would_return_invocation, run_module_as_usual
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    SERVING_PLAN_ARGUMENT_SPEC, model_needs_node_files, serving_plan_result,
)

MODULE_NAME = 'kvpin.fleet.serving_plan'


class ActionModule(ActionBase):

    _supports_check_mode = True   # computes only, on either side
    _supports_async = True        # async runs the module on the node

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp  # tmp no longer has any effect

        if self._task.async_val or model_needs_node_files(self._task.args.get('model')):
            result.update(run_module_as_usual(self, MODULE_NAME, task_vars))
            return result

        params = self._validated_params()
        planned = serving_plan_result(params)
        if module_would_return_invocation(task_vars):
            planned['invocation'] = dict(module_args=params)
        # Through JSON as a module's result comes back, so both paths give equal values
        # (lists, not tuples; plain str and dict keys).
        result.update(json.loads(json.dumps(planned)))
        return result

    def _validated_params(self):
        """The task args through the module's own spec: same coercion, same errors."""
        try:
            return self.validate_argument_spec(argument_spec=SERVING_PLAN_ARGUMENT_SPEC)[1]
        except AnsibleActionFail as error:
            # ActionBase names this plugin by its Python path in "Unsupported parameters for
            # (...) module"; the module names itself by its FQCN, as should this message.
            raise AnsibleActionFail(error.message.replace('(%s)' % self._load_name, '(%s)' % MODULE_NAME),
                                    obj=self._task.args) from None
