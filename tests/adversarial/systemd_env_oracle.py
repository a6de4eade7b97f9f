# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What systemd reads from an EnvironmentFile= (TEST-ONLY oracle): a Python port of the state
machine in systemd's src/basic/env-file.c (parse_env_file_internal)."""

WHITESPACE = ' \t\n\r'
NEWLINE = '\n\r'
SHELL_NEED_ESCAPE = '"\\`$'


def systemd_parse(text):
    """What systemd reads from an EnvironmentFile (the state machine of env-file.c, as of
    systemd 256), as a dict. Test-only: the oracle the writer is checked against."""
    result = {}
    state, key, value = 'PRE_KEY', [], []
    last_value_ws = None
    last_key_ws = None

    def push():
        k = ''.join(key[:last_key_ws] if last_key_ws is not None else key)
        result[k] = ''.join(value)

    for char in text:
        if state == 'PRE_KEY':
            if char in '#;':
                state = 'COMMENT'
            elif char not in WHITESPACE:
                state, key, last_key_ws = 'KEY', [char], None
        elif state == 'KEY':
            if char in NEWLINE:
                state, key = 'PRE_KEY', []
            elif char == '=':
                state, value, last_value_ws = 'PRE_VALUE', [], None
            else:
                if char not in WHITESPACE:
                    last_key_ws = None
                elif last_key_ws is None:
                    last_key_ws = len(key)
                key.append(char)
        elif state == 'PRE_VALUE':
            if char in NEWLINE:
                push()
                state, key, value = 'PRE_KEY', [], []
            elif char == "'":
                state = 'SINGLE'
            elif char == '"':
                state = 'DOUBLE'
            elif char == '\\':
                state = 'VALUE_ESCAPE'
            elif char not in WHITESPACE:
                state = 'VALUE'
                value.append(char)
        elif state == 'VALUE':
            if char in NEWLINE:
                if last_value_ws is not None:
                    del value[last_value_ws:]
                push()
                state, key, value = 'PRE_KEY', [], []
            elif char == '\\':
                state, last_value_ws = 'VALUE_ESCAPE', None
            else:
                if char not in WHITESPACE:
                    last_value_ws = None
                elif last_value_ws is None:
                    last_value_ws = len(value)
                value.append(char)
        elif state == 'VALUE_ESCAPE':
            state = 'VALUE'
            if char not in NEWLINE:
                value.append(char)
        elif state == 'SINGLE':
            if char == "'":
                state = 'PRE_VALUE'
            else:
                value.append(char)
        elif state == 'DOUBLE':
            if char == '"':
                state = 'PRE_VALUE'
            elif char == '\\':
                state = 'DOUBLE_ESCAPE'
            else:
                value.append(char)
        elif state == 'DOUBLE_ESCAPE':
            state = 'DOUBLE'
            if char in SHELL_NEED_ESCAPE:
                value.append(char)
            elif char != '\n':
                value.extend(['\\', char])
        elif state == 'COMMENT':
            if char == '\\':
                state = 'COMMENT_ESCAPE'
            elif char in NEWLINE:
                state = 'PRE_KEY'
        elif state == 'COMMENT_ESCAPE':
            state = 'PRE_KEY' if char in NEWLINE else 'COMMENT'
    if state in ('PRE_VALUE', 'VALUE', 'VALUE_ESCAPE', 'SINGLE', 'DOUBLE', 'DOUBLE_ESCAPE'):
        if state == 'VALUE' and last_value_ws is not None:
            del value[last_value_ws:]
        push()
    return result
