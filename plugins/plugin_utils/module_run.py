# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection's action plugins share: running their module the usual way (copied to
the task's host and run there) when they do not run its function in the controller's process,
and the result keys a module run would carry when they do."""

from ansible import constants as C


def run_module_as_usual(action, module_name, task_vars):
    """Run module_name with the task's arguments through action's connection, as ActionBase's
    normal plugin does (async wrapped where the connection has none of its own), and remove
    the remote temporary directory unless an async job still needs it."""
    wrap_async = action._task.async_val and not action._connection.has_native_async
    try:
        return action._execute_module(module_name=module_name, module_args=action._task.args,
                                      task_vars=task_vars, wrap_async=wrap_async)
    finally:
        if not wrap_async:
            action._remove_tmp_path(action._connection._shell.tmpdir)


def module_would_return_invocation(task_vars):
    """True when a module run for this task would carry ``invocation`` in its result.

    Before ansible-core 2.21 every module result did. 2.21 added INJECT_INVOCATION (default
    false; ``ANSIBLE_INJECT_INVOCATION``, ``ansible_inject_invocation``): a module adds it only
    when that is set, so an in-process run must ask the same setting to give the same answer."""
    if C.config.get_configuration_definition('INJECT_INVOCATION') is None:
        return True
    return bool(C.config.get_config_value('INJECT_INVOCATION', variables=task_vars))
