# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Environment for a systemd unit, written as an ``EnvironmentFile=`` (mode 0600) instead of
``Environment=`` lines in a world-readable unit.

The file's syntax is systemd's (src/basic/env-file.c, parse_env_file_internal): one
``NAME=value`` per line; a value in double quotes keeps every character as it is (newlines
included) except that a backslash followed by one of ``"``, ``\\``, ``\u0060`` or ``$`` stands
for that character, and a backslash before a newline is dropped. So each value is written in
double quotes with exactly those four characters escaped: a quote or a newline in a value can
never end the assignment or start another line of the file. Nothing in the file is expanded
(no ``%`` specifiers, no ``$VAR``), unlike ``Environment=`` in a unit.

Names are checked against what both systemd and a shell accept (``[A-Za-z_][A-Za-z0-9_]*``):
they are the only part of the environment that goes into the unit (``podman/docker run -e
NAME`` passes the value on from the unit's environment). Errors name the variable, never its
value (it may be a secret).
"""

from __future__ import annotations

import re

ENV_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')
# Characters a backslash escapes inside double quotes (SHELL_NEED_ESCAPE in systemd).
_NEED_ESCAPE = '"\\`$'
# Longest value accepted, in bytes of UTF-8 (systemd refuses far larger environment blocks).
MAX_VALUE_BYTES = 128 * 1024


class SystemdEnvError(ValueError):
    """An environment systemd cannot take as given; ``name`` is the variable at fault (or None)."""

    def __init__(self, name, message):
        super().__init__(message)
        self.name = name


def env_names(environment, what='environment'):
    """The variable names of ``environment`` (a dict), sorted, each checked."""
    if environment is None:
        return []
    if not isinstance(environment, dict):
        raise SystemdEnvError(None, '%s must be a dict of NAME: value, got %s' % (what, type(environment).__name__))
    names = []
    for name in environment:
        if not isinstance(name, str) or not ENV_NAME.match(name):
            shown = name if isinstance(name, str) and len(name) <= 80 else '(not shown)'
            raise SystemdEnvError(None, '%s: %r is not a variable name (letters, digits and _, not starting with a '
                                        'digit)' % (what, shown))
        names.append(name)
    return sorted(names)


def env_value_text(name, value, what='environment'):
    """``value`` as the string the process will see: strings as they are, numbers in decimal,
    booleans as true/false; anything else refused (named, not shown)."""
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise SystemdEnvError(name, '%s.%s must be a string or a number, got %s' % (what, name, type(value).__name__))
    if '\x00' in value:
        raise SystemdEnvError(name, '%s.%s holds a NUL character, which no environment can carry' % (what, name))
    try:
        size = len(value.encode('utf-8'))
    except UnicodeEncodeError:
        raise SystemdEnvError(name, '%s.%s is not valid UTF-8 (systemd drops such a value)' % (what, name))
    if size > MAX_VALUE_BYTES:
        raise SystemdEnvError(name, '%s.%s is %d bytes, more than %d' % (what, name, size, MAX_VALUE_BYTES))
    return value


def quote_env_value(text):
    """``text`` double-quoted for an EnvironmentFile: it reads back exactly as ``text``."""
    return '"%s"' % ''.join('\\' + char if char in _NEED_ESCAPE else char for char in text)


def env_file_content(environment, header='', what='environment'):
    """The EnvironmentFile for ``environment``: ``header`` lines (each made a comment), then
    ``NAME="value"`` lines sorted by name; ends with a newline."""
    lines = ['# ' + line if line else '#' for line in header.splitlines()] if header else []
    for name in env_names(environment, what):
        lines.append('%s=%s' % (name, quote_env_value(env_value_text(name, environment[name], what))))
    return '\n'.join(lines) + '\n' if lines else ''
