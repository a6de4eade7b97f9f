# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a node already match what the roles would write? Read-only comparisons behind
``kvpin.fleet.node_state``.

The controller computes the desired state (file hashes, modes and owners, units, users,
groups, health URLs, package versions); this compares it with the node in one round trip.
A check is "in sync" only when every object it names was read and matched: anything that
cannot be read (permission denied, systemctl failing, an interpreter that does not start)
is drift with the reason, because "in sync" makes the roles skip their converge tasks.

Drift lines name the object and both values where there are values, never file contents::

    /etc/gpustack/config.yaml: content differs (sha1 3f2a... wanted 9b1c...)
    /etc/x: mode 0644, wanted 0600
    user kvpin-watchdog: missing
    gpustack.service: ActiveState inactive (dead), wanted active
    http://127.0.0.1:10150/healthz: status 503, wanted 200
    gpustack 0.7.1 in /opt/gpustack/bin/python: installed 0.7.0

Each line is a ``Drift``: the message is for people, and the same difference as data (its
``item``: ``{object, field, want, got}``) is what the roles decide on, so rewording a message
never changes what a role converges. ``got`` is None where the value could not be read (the
message says why) and ``'missing'`` (field ``state``) where the object does not exist.

Stdlib only (http_deadline, the one module_util it imports, too) and Python >= 3.8: this runs on
the managed node.
"""

from __future__ import annotations

import errno
import grp
import hashlib
import http.client
import json
import math
import os
import pwd
import re
import shutil
import socket
import stat
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ansible_collections.kvpin.fleet.plugins.module_utils.http_deadline import Deadline

FILE_STATES = ('file', 'directory', 'absent')

# Read by `systemctl show`, in this order on the command line.
UNIT_PROPERTIES = ('Id', 'LoadState', 'ActiveState', 'SubState', 'UnitFileState', 'NeedDaemonReload')

# A unit wanted enabled must be started at every boot by its own [Install] links in /etc:
# UnitFileState `enabled`, and nothing else (systemctl(1), is-enabled). `enabled-runtime` links
# live in /run and are gone after the next reboot; `linked`/`linked-runtime` only make the unit
# file known; `static` has no [Install] section (it runs only when something else pulls it
# in); `generated` is made by a generator at each boot, not by the role; `indirect`/`alias`
# say that another name is what is enabled. So all of them are drift for enabled: true.
ENABLED_AT_BOOT_UNIT_FILE_STATE = 'enabled'
# UnitFileState values under which a unit is enabled now (it starts at this boot through its
# links): a unit wanted disabled is drift in any of them.
ENABLED_UNIT_FILE_STATES = ('enabled', 'enabled-runtime')
# ActiveState values of a unit that runs or is starting: a unit wanted stopped is drift in them.
RUNNING_ACTIVE_STATES = ('active', 'activating', 'reloading')

UNIT_SUFFIXES = ('service', 'socket', 'target', 'timer', 'mount', 'automount', 'path', 'slice',
                 'scope', 'swap', 'device')
UNIT_NAME_RE = re.compile(r'^[^\s/-][^\s/]*\.(%s)$' % '|'.join(UNIT_SUFFIXES))
MODE_RE = re.compile(r'^[0-7]{3,4}$')
SHA1_RE = re.compile(r'^[0-9a-fA-F]{40}$')

HASH_CHUNK_BYTES = 64 * 1024
# Hashing node files inside the probe's one round trip, bounded per file and per call (bytes read,
# seconds spent). What the roles write is configs, units and a small Python package: kilobytes. A
# file over these is not read; it is reported as such (``sha1_skipped``) and is drift only where
# the check's wanted size or mtime differs, or where it wants neither (in sync means read).
HASH_MAX_FILE_BYTES = 64 * 1024 * 1024
HASH_MAX_CALL_BYTES = 256 * 1024 * 1024
HASH_FILE_SECONDS = 10.0
HASH_CALL_SECONDS = 30.0
# How a file is opened to be hashed: never through a symbolic link swapped in after lstat, never
# blocking on a FIFO or a device swapped in (fstat on the descriptor then says what it is).
HASH_OPEN_FLAGS = (os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_NONBLOCK', 0)
                   | getattr(os, 'O_NOCTTY', 0) | getattr(os, 'O_CLOEXEC', 0))
SYSTEMCTL_TIMEOUT_SECONDS = 60
PYTHON_TIMEOUT_SECONDS = 60
# Where systemctl lives when the module's PATH is minimal.
SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
# AnsibleModule.run_command has no timeout, and every command of the probe's one round trip
# must be bounded: coreutils' timeout(1) runs it, and says 124 when it ran out of time and
# 125..127 when it could not start it (a command that is missing: 127). After the time, TERM;
# KILL_AFTER_SECONDS later, KILL.
TIMED_OUT_RC = 124
NOT_STARTED_RCS = (125, 126, 127)
KILL_AFTER_SECONDS = 5


class CommandNotRun(Exception):
    """A command that did not run to an exit status of its own: the message says why."""


def module_command_runner(module):
    """``run_command(argv, seconds) -> (rc, stdout, stderr)`` through ``module.run_command``,
    each command under coreutils' timeout(1): what the node-side functions below are given."""
    timeout_bin = find_command('timeout')

    def run_command(argv, seconds):
        if not timeout_bin:
            raise CommandNotRun('timeout (coreutils) not found, so %s cannot be bounded in time' % argv[0])
        # handle_exceptions=False: an OSError reaches run_bounded, which names it.
        return module.run_command([timeout_bin, '--kill-after=%d' % KILL_AFTER_SECONDS, '%d' % seconds]
                                  + list(argv), check_rc=False, expand_user_and_vars=False,
                                  handle_exceptions=False)
    return run_command


def run_bounded(run_command, argv, seconds):
    """(rc, stdout, stderr) of ``argv`` run by ``run_command`` within ``seconds``; CommandNotRun
    when it timed out or could not start."""
    if run_command is None:
        raise ValueError('a command runner is needed to run %s (module_command_runner(module))' % argv[0])
    try:
        rc, stdout, stderr = run_command(argv, seconds)
    except OSError as exc:
        raise CommandNotRun(str(exc)) from exc
    if rc == TIMED_OUT_RC:
        raise CommandNotRun('timed out after %d s' % seconds)
    if rc in NOT_STARTED_RCS:
        detail = (stderr or '').strip().splitlines()
        raise CommandNotRun(detail[-1] if detail else 'could not start (rc %d)' % rc)
    return rc, stdout or '', stderr or ''


# Run by each interpreter named in python_packages: argv[1:] are distribution names; prints
# {name: version or null}. importlib.metadata from 3.8; pkg_resources for older venvs.
PACKAGE_VERSIONS_SCRIPT = '''
import json, sys
try:
    from importlib.metadata import version, PackageNotFoundError
except ImportError:
    import pkg_resources
    PackageNotFoundError = pkg_resources.DistributionNotFound
    def version(name):
        return pkg_resources.get_distribution(name).version
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = version(name)
    except PackageNotFoundError:
        found[name] = None
sys.stdout.write(json.dumps(found))
'''


class NodeStateInputError(ValueError):
    """A check that cannot be compared as given: names the check, the field and the value."""

    def __init__(self, check, field_name, value, problem):
        super().__init__('check %s: %s %r: %s' % (check, field_name, value, problem))
        self.check = check
        self.field = field_name
        self.value = value


@dataclass(frozen=True)
class FileSpec:
    path: str
    state: str = 'file'
    sha1: Optional[str] = None  # lower-case hex
    mode: Optional[int] = None  # permission bits, as stat.S_IMODE gives them
    owner: Optional[str] = None
    group: Optional[str] = None
    # For a directory: the names it must hold, exactly (an extra entry is drift: a leftover of
    # something removed from the inventory, such as a deleted deployment's watchdog config).
    entries: Optional[Tuple[str, ...]] = None
    # Read the content's sha1 without a wanted value: a check that only says what to observe
    # (site.yml's probe runs before the plans that decide the contents exist).
    read_sha1: bool = False
    # The wanted size in bytes and mtime (seconds since the epoch): what decides whether a file
    # too large to hash (HASH_MAX_FILE_BYTES) or not hashed in time is drift.
    size: Optional[int] = None
    mtime: Optional[float] = None


@dataclass(frozen=True)
class UnitSpec:
    name: str
    enabled: Optional[bool] = None
    active: Optional[bool] = None


@dataclass(frozen=True)
class HttpSpec:
    url: str
    status: int = 200
    timeout: float = 5.0


@dataclass(frozen=True)
class PythonPackageSpec:
    python: str
    name: str
    version: Optional[str] = None  # None: installed at any version


@dataclass(frozen=True)
class UserSpec:
    """A user that must exist; each attribute given (not None) must also be as stated."""
    name: str
    group: Optional[str] = None   # primary group, by name
    shell: Optional[str] = None
    home: Optional[str] = None


USER_ATTRIBUTES = ('group', 'shell', 'home')


@dataclass(frozen=True)
class CheckSpec:
    name: str
    files: Tuple[FileSpec, ...] = ()
    users: Tuple[UserSpec, ...] = ()
    groups: Tuple[str, ...] = ()
    units: Tuple[UnitSpec, ...] = ()
    http: Tuple[HttpSpec, ...] = ()
    python_packages: Tuple[PythonPackageSpec, ...] = ()


@dataclass(frozen=True)
class UnitState:
    """One unit as `systemctl show` printed it, or why it could not be read (``error``)."""
    name: str
    properties: Dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None

    def get(self, prop):
        return self.properties.get(prop, '')


class Drift(str):
    """One drift line: the str is the human message (byte for byte what the module always
    printed); ``item`` is the same difference as data, ``{object, field, want, got}``:

    - object: the file path, ``user NAME``, ``group NAME``, the unit name, the URL, or
      ``NAME in PYTHON`` for a package;
    - field: ``state`` (exists / kind / readable), ``sha1``, ``mode``, ``owner``, ``group``,
      ``entries``; a user's ``group``/``shell``/``home``; a unit's ``NeedDaemonReload``,
      ``LoadState``, ``UnitFileState``, ``ActiveState``; ``status`` of a URL; ``version``;
    - want / got: the wanted and the observed value (got None: could not be read)."""

    def __new__(cls, message, obj=None, field_name=None, want=None, got=None):
        line = super().__new__(cls, message)
        line.item = {'object': obj, 'field': field_name, 'want': want, 'got': got}
        return line

    def __reduce__(self):
        # copy/deepcopy/pickle keep the item (a str subclass would otherwise lose it).
        return (Drift, (str(self), self.item['object'], self.item['field'], self.item['want'], self.item['got']))


def drift_item(line):
    """The item of a drift line (a copy); a plain string (no item) names no field."""
    item = getattr(line, 'item', None)
    return dict(item) if isinstance(item, dict) else {'object': None, 'field': None, 'want': None, 'got': None}


@dataclass
class CheckResult:
    name: str
    drift: List[str] = field(default_factory=list)

    @property
    def in_sync(self):
        return not self.drift

    @property
    def drift_items(self):
        return [drift_item(line) for line in self.drift]


# -- input ---------------------------------------------------------------------------------

def format_mode(mode):
    return '%04o' % mode


def _given(raw, key, default=None):
    """A key of a raw option dict; Ansible fills unset suboptions with None."""
    value = raw.get(key)
    return default if value is None else value


def _require_str(check, field_name, value):
    if not isinstance(value, str) or not value:
        raise NodeStateInputError(check, field_name, value, 'must be a non-empty string')
    return value


def _list(check, field_name, values):
    if not isinstance(values, (list, tuple)):
        raise NodeStateInputError(check, field_name, values, 'must be a list')
    return values


def _string_list(check, field_name, values):
    if not isinstance(values, (list, tuple)):
        raise NodeStateInputError(check, field_name, values, 'must be a list of strings')
    return tuple(_require_str(check, field_name, v) for v in values)


def _parse_user(check, index, raw):
    """A user name (it must exist) or {name, group, shell, home} (each given one must match)."""
    where = 'users[%d]' % index
    if isinstance(raw, str):
        return UserSpec(name=_require_str(check, where, raw))
    if not isinstance(raw, dict):
        raise NodeStateInputError(check, where, raw, 'must be a user name or a dict with name, group, shell, home')
    unknown = sorted(set(raw) - set(('name',) + USER_ATTRIBUTES))
    if unknown:
        raise NodeStateInputError(check, where, raw, 'unknown keys %s' % ', '.join(unknown))
    given = dict((key, None if raw.get(key) is None else _require_str(check, '%s.%s' % (where, key), raw.get(key)))
                 for key in USER_ATTRIBUTES)
    return UserSpec(name=_require_str(check, where + '.name', raw.get('name')), **given)


def _dict_list(check, field_name, values):
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, dict) for v in values):
        raise NodeStateInputError(check, field_name, values, 'must be a list of dicts')
    return values


def parse_mode(check, field_name, value):
    """"0600" or "644" (octal digits) -> 0o600. An int is taken as the mode's value, as
    ansible.builtin.file takes it (YAML reads an unquoted 0600 as the int 384)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise NodeStateInputError(check, field_name, value, 'must be an octal string like "0600"')
    if isinstance(value, int):
        if not 0 <= value <= 0o7777:
            raise NodeStateInputError(check, field_name, value, 'is not a permission mode (0 to 07777)')
        return value
    if not isinstance(value, str) or not MODE_RE.match(value):
        raise NodeStateInputError(check, field_name, value, 'must be 3 or 4 octal digits like "0600"')
    return int(value, 8)


def _parse_file(check, index, raw):
    where = 'files[%d]' % index
    path = raw.get('path')
    if not isinstance(path, str) or not os.path.isabs(path):
        raise NodeStateInputError(check, where + '.path', path, 'must be an absolute path')
    # A trailing slash would make lstat follow a symlink at the end of the path.
    if len(path) > 1:
        path = path.rstrip('/') or '/'
    state = _given(raw, 'state', 'file')
    if state not in FILE_STATES:
        raise NodeStateInputError(check, where + '.state', state, 'must be one of %s' % ', '.join(FILE_STATES))
    sha1 = raw.get('sha1')
    if sha1 is not None:
        if not isinstance(sha1, str) or not SHA1_RE.match(sha1):
            raise NodeStateInputError(check, where + '.sha1', sha1, 'must be 40 hex digits')
        if state != 'file':
            raise NodeStateInputError(check, where + '.sha1', sha1, 'only applies to state file, not %s' % state)
        sha1 = sha1.lower()
    read_sha1 = _optional_bool(check, where + '.read_sha1', raw.get('read_sha1'))
    if read_sha1 and state != 'file':
        raise NodeStateInputError(check, where + '.read_sha1', read_sha1, 'only applies to state file, not %s' % state)
    mode = parse_mode(check, where + '.mode', raw.get('mode'))
    owner = raw.get('owner')
    group = raw.get('group')
    if owner is not None:
        _require_str(check, where + '.owner', owner)
    if group is not None:
        _require_str(check, where + '.group', group)
    if state == 'absent' and (mode is not None or owner is not None or group is not None):
        raise NodeStateInputError(check, where + '.state', state, 'mode, owner and group do not apply to absent')
    size = raw.get('size')
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
        raise NodeStateInputError(check, where + '.size', size, 'must be a number of bytes (an integer >= 0)')
    mtime = raw.get('mtime')
    if mtime is not None and (isinstance(mtime, bool) or not isinstance(mtime, (int, float))
                              or not math.isfinite(mtime)):
        raise NodeStateInputError(check, where + '.mtime', mtime, 'must be seconds since the epoch (a finite number)')
    for name, value in (('size', size), ('mtime', mtime)):
        if value is not None and state != 'file':
            raise NodeStateInputError(check, where + '.' + name, value, 'only applies to state file, not %s' % state)
    entries = raw.get('entries')
    if entries is not None:
        if state != 'directory':
            raise NodeStateInputError(check, where + '.entries', entries, 'only applies to state directory')
        if not isinstance(entries, list) or not all(isinstance(e, str) and e and '/' not in e for e in entries):
            raise NodeStateInputError(check, where + '.entries', entries, 'must be a list of file names')
        entries = tuple(sorted(set(entries)))
    return FileSpec(path=path, state=state, sha1=sha1, mode=mode, owner=owner, group=group, entries=entries,
                    read_sha1=bool(read_sha1), size=size, mtime=None if mtime is None else float(mtime))


def _optional_bool(check, field_name, value):
    if value is not None and not isinstance(value, bool):
        raise NodeStateInputError(check, field_name, value, 'must be true or false')
    return value


def _parse_unit(check, index, raw):
    where = 'units[%d]' % index
    name = raw.get('name')
    if not isinstance(name, str) or not UNIT_NAME_RE.match(name):
        raise NodeStateInputError(check, where + '.name', name,
                                  'must be a full unit name like gpustack.service (suffix %s)'
                                  % ', '.join(UNIT_SUFFIXES))
    return UnitSpec(name=name, enabled=_optional_bool(check, where + '.enabled', raw.get('enabled')),
                    active=_optional_bool(check, where + '.active', raw.get('active')))


def _parse_http(check, index, raw):
    where = 'http[%d]' % index
    url = raw.get('url')
    if not isinstance(url, str) or not url.lower().startswith(('http://', 'https://')):
        raise NodeStateInputError(check, where + '.url', url, 'must be an http:// or https:// URL')
    status = _given(raw, 'status', 200)
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise NodeStateInputError(check, where + '.status', status, 'must be an HTTP status code')
    timeout = _given(raw, 'timeout', 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise NodeStateInputError(check, where + '.timeout', timeout, 'must be a positive number of seconds')
    return HttpSpec(url=url, status=status, timeout=float(timeout))


def _parse_python_package(check, index, raw):
    where = 'python_packages[%d]' % index
    python = raw.get('python')
    if not isinstance(python, str) or not os.path.isabs(python):
        raise NodeStateInputError(check, where + '.python', python, 'must be an absolute interpreter path')
    return PythonPackageSpec(python=python,
                             name=_require_str(check, where + '.name', raw.get('name')),
                             version=(None if raw.get('version') is None
                                      else _require_str(check, where + '.version', raw.get('version'))))


def parse_checks(raw_checks):
    """The module's ``checks`` option -> CheckSpec list. Raises NodeStateInputError on the
    first check that cannot be compared as given (before anything on the node is read)."""
    if not isinstance(raw_checks, (list, tuple)):
        raise NodeStateInputError('-', 'checks', raw_checks, 'must be a list of dicts')
    checks = []
    seen = set()
    for index, raw in enumerate(raw_checks):
        if not isinstance(raw, dict):
            raise NodeStateInputError('#%d' % index, 'checks[%d]' % index, raw, 'must be a dict')
        name = raw.get('name')
        if not isinstance(name, str) or not name:
            raise NodeStateInputError('#%d' % index, 'name', name, 'must be a non-empty string')
        if name in seen:
            raise NodeStateInputError(name, 'name', name, 'duplicate check name')
        seen.add(name)
        checks.append(CheckSpec(
            name=name,
            files=tuple(_parse_file(name, i, f) for i, f in enumerate(_dict_list(name, 'files', _given(raw, 'files', [])))),
            users=tuple(_parse_user(name, i, u) for i, u in enumerate(_list(name, 'users', _given(raw, 'users', [])))),
            groups=_string_list(name, 'groups', _given(raw, 'groups', [])),
            units=tuple(_parse_unit(name, i, u) for i, u in enumerate(_dict_list(name, 'units', _given(raw, 'units', [])))),
            http=tuple(_parse_http(name, i, h) for i, h in enumerate(_dict_list(name, 'http', _given(raw, 'http', [])))),
            python_packages=tuple(_parse_python_package(name, i, p) for i, p in enumerate(
                _dict_list(name, 'python_packages', _given(raw, 'python_packages', [])))),
        ))
    return checks


# -- files, users, groups ------------------------------------------------------------------

class HashBudget:
    """What one call may spend hashing files: bytes and seconds per file and in all. ``bytes_read``
    is what it has read."""

    def __init__(self, max_file_bytes=None, max_call_bytes=None, file_seconds=None, call_seconds=None,
                 clock=time.monotonic):
        self.max_file_bytes = HASH_MAX_FILE_BYTES if max_file_bytes is None else max_file_bytes
        self.max_call_bytes = HASH_MAX_CALL_BYTES if max_call_bytes is None else max_call_bytes
        self.file_seconds = HASH_FILE_SECONDS if file_seconds is None else file_seconds
        self.call_seconds = HASH_CALL_SECONDS if call_seconds is None else call_seconds
        self.clock = clock
        self.started = clock()
        self.bytes_read = 0

    def why_not(self, size):
        """Why a file of ``size`` bytes is not hashed (None: it is)."""
        if size > self.max_file_bytes:
            return 'over-size: %d B, over the %d B a file is hashed up to' % (size, self.max_file_bytes)
        if self.bytes_read + size > self.max_call_bytes:
            return ('over the call\'s hashing budget: %d B more would pass the %d B one call reads'
                    % (size, self.max_call_bytes))
        if self.clock() - self.started >= self.call_seconds:
            return 'not hashed within the call\'s %g s' % self.call_seconds
        return None


class NotHashed(Exception):
    """A file left unhashed by its budget; the message says why (over-size, out of time)."""


def hash_descriptor(fd, size, budget):
    """Hex sha1 of the open regular file ``fd`` of ``size`` bytes (fstat), read in chunks within
    ``budget`` (NotHashed otherwise); a file that grew since fstat is not hashed past its bound."""
    reason = budget.why_not(size)
    if reason:
        raise NotHashed(reason)
    digest = hashlib.sha1()
    started = budget.clock()
    limit = min(budget.max_file_bytes, budget.max_call_bytes - budget.bytes_read)
    done = 0
    while True:
        chunk = os.read(fd, min(HASH_CHUNK_BYTES, limit + 1 - done))
        if not chunk:
            return digest.hexdigest()
        done += len(chunk)
        budget.bytes_read += len(chunk)
        if done > limit:
            raise NotHashed('over-size: it grew past the %d B a file is hashed up to while being read' % limit)
        digest.update(chunk)
        now = budget.clock()
        if now - started >= budget.file_seconds or now - budget.started >= budget.call_seconds:
            raise NotHashed('not hashed within %g s (%d of %d B read)' % (
                min(budget.file_seconds, budget.call_seconds), done, size))


def open_regular(path):
    """(descriptor, fstat) of ``path`` opened without following a final symbolic link and without
    blocking (HASH_OPEN_FLAGS); OSError as open raises it (ELOOP: the path is a symbolic link)."""
    fd = os.open(path, HASH_OPEN_FLAGS)
    try:
        return fd, os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise


def sha1_of_file(path, budget=None):
    """Hex sha1 of a regular file's content, read in chunks within ``budget`` (a fresh HashBudget
    by default): OSError when the path is not a regular file (ELOOP for a symbolic link), NotHashed
    when it is over the budget."""
    fd, st = open_regular(path)
    try:
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, 'not a regular file (%s)' % _file_kind(st.st_mode))
        return hash_descriptor(fd, st.st_size, budget or HashBudget())
    finally:
        os.close(fd)


def _error_text(exc):
    return exc.strerror or str(exc)


def _file_kind(st_mode):
    if stat.S_ISREG(st_mode):
        return 'a file'
    if stat.S_ISDIR(st_mode):
        return 'a directory'
    if stat.S_ISLNK(st_mode):
        return 'a symlink'
    if stat.S_ISSOCK(st_mode):
        return 'a socket'
    if stat.S_ISFIFO(st_mode):
        return 'a fifo'
    if stat.S_ISBLK(st_mode) or stat.S_ISCHR(st_mode):
        return 'a device'
    return 'something else'


def user_name(uid):
    """Name of a uid, or the number as text when the uid has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


MAX_DIRECTORY_ENTRIES = 4096


def _lstat_seen(path):
    """(lstat result, None) or (None, what observe_file reports when the path cannot be read)."""
    try:
        return os.lstat(path), None
    except OSError as exc:
        # ENOTDIR: a parent is not a directory, so the path does not exist either.
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None, {'kind': 'missing'}
        return None, {'error': _error_text(exc)}


def observe_file(path, want_sha1=False, want_entries=False, budget=None):
    """What the node has at ``path``, as JSON-able data: ``kind`` ('missing', 'a file', 'a
    directory', ...), or ``error`` when it cannot be read; for files and directories the mode,
    owner and group, for a file its size and mtime and, when ``want_sha1``, the sha1 of its
    content within ``budget`` (HashBudget; ``sha1_skipped`` says why not: over-size, out of time).

    A file to hash is opened without following a symbolic link and without blocking
    (HASH_OPEN_FLAGS), and what is reported is what fstat says of the open descriptor: a path
    swapped for a link, a FIFO or a device after lstat is reported as that, never read."""
    st, failed = _lstat_seen(path)
    if failed is not None:
        return failed
    sha1 = skipped = sha1_error = None
    if want_sha1 and stat.S_ISREG(st.st_mode):
        try:
            fd, st = open_regular(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                # swapped for a symbolic link since lstat: report the link, never its target
                st, failed = _lstat_seen(path)
                if failed is not None:
                    return failed
            elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return {'kind': 'missing'}
            else:
                sha1_error = _error_text(exc)
        else:
            try:
                if stat.S_ISREG(st.st_mode):
                    sha1 = hash_descriptor(fd, st.st_size, budget or HashBudget())
            except NotHashed as exc:
                skipped = str(exc)
            except OSError as exc:
                sha1_error = _error_text(exc)
            finally:
                os.close(fd)
    kind = _file_kind(st.st_mode)
    seen = {'kind': kind, 'mode': stat.S_IMODE(st.st_mode),
            'owner': user_name(st.st_uid), 'group': group_name(st.st_gid)}
    if kind == 'a file':
        seen.update(size=st.st_size, mtime=st.st_mtime)
    if sha1 is not None:
        seen['sha1'] = sha1
    if skipped is not None:
        seen['sha1_skipped'] = skipped
    if sha1_error is not None:
        seen['sha1_error'] = sha1_error
    if want_entries and kind == 'a directory':
        try:
            seen['entries'] = sorted(os.listdir(path))[:MAX_DIRECTORY_ENTRIES]
        except OSError as exc:
            seen['entries_error'] = _error_text(exc)
    return seen


def _kind_state(kind):
    """observe_file's kind ('a directory') as a state value ('directory')."""
    return kind[2:] if isinstance(kind, str) and kind.startswith('a ') else kind


def compare_file(spec, seen):
    """Drift lines for one FileSpec against what observe_file saw (None: not observed)."""
    path = spec.path
    if seen is None:
        return [Drift('%s: not observed' % path, path, 'state', spec.state, None)]
    if seen.get('error'):
        return [Drift('%s: cannot be read (%s)' % (path, seen['error']), path, 'state', spec.state, None)]
    kind = seen.get('kind')
    if kind == 'missing':
        return [] if spec.state == 'absent' else [Drift('%s: missing' % path, path, 'state', spec.state, 'missing')]
    if spec.state == 'absent':
        return [Drift('%s: exists (%s), wanted absent' % (path, kind), path, 'state', 'absent', _kind_state(kind))]
    wanted_kind = 'a file' if spec.state == 'file' else 'a directory'
    if kind != wanted_kind:
        return [Drift('%s: is %s, wanted %s' % (path, kind, wanted_kind), path, 'state', spec.state, _kind_state(kind))]

    drift = []
    if spec.sha1 is not None and seen.get('sha1_skipped'):
        drift.extend(_unhashed_drift(spec, seen))
    elif spec.sha1 is not None:
        if seen.get('sha1_error'):
            drift.append(Drift('%s: content cannot be read (%s)' % (path, seen['sha1_error']), path, 'sha1', spec.sha1, None))
        elif seen.get('sha1') is None:
            drift.append(Drift('%s: content not observed' % path, path, 'sha1', spec.sha1, None))
        elif seen['sha1'] != spec.sha1.lower():
            drift.append(Drift('%s: content differs (sha1 %s wanted %s)' % (path, seen['sha1'], spec.sha1),
                               path, 'sha1', spec.sha1, seen['sha1']))
    if spec.mode is not None and seen.get('mode') != spec.mode:
        drift.append(Drift('%s: mode %s, wanted %s' % (path, format_mode(seen['mode']), format_mode(spec.mode)),
                           path, 'mode', format_mode(spec.mode), format_mode(seen['mode'])))
    if spec.owner is not None and seen.get('owner') != spec.owner:
        drift.append(Drift('%s: owner %s, wanted %s' % (path, seen.get('owner'), spec.owner),
                           path, 'owner', spec.owner, seen.get('owner')))
    if spec.group is not None and seen.get('group') != spec.group:
        drift.append(Drift('%s: group %s, wanted %s' % (path, seen.get('group'), spec.group),
                           path, 'group', spec.group, seen.get('group')))
    if spec.entries is not None:
        if seen.get('entries_error'):
            drift.append(Drift('%s: entries cannot be read (%s)' % (path, seen['entries_error']),
                               path, 'entries', list(spec.entries), None))
        elif seen.get('entries') is None:
            drift.append(Drift('%s: entries not observed' % path, path, 'entries', list(spec.entries), None))
        else:
            extra = sorted(set(seen['entries']) - set(spec.entries))
            if extra:
                drift.append(Drift('%s: unexpected entries %s' % (path, ', '.join(extra)),
                                   path, 'entries', list(spec.entries), sorted(set(seen['entries']))))
    return drift


def _unhashed_drift(spec, seen):
    """Drift of a file whose content was not hashed (``sha1_skipped``: over-size, out of time):
    its size or mtime where the check wants one and the node's differs; where the check wants
    neither, the content is not known to match, which is drift."""
    path, why = spec.path, seen['sha1_skipped']
    drift = []
    if spec.size is not None and seen.get('size') != spec.size:
        drift.append(Drift('%s: size %s B, wanted %d B (content not hashed: %s)' % (path, seen.get('size'), spec.size, why),
                           path, 'size', spec.size, seen.get('size')))
    if spec.mtime is not None and seen.get('mtime') != spec.mtime:
        drift.append(Drift('%s: mtime %s, wanted %s (content not hashed: %s)' % (path, seen.get('mtime'), spec.mtime, why),
                           path, 'mtime', spec.mtime, seen.get('mtime')))
    if spec.size is None and spec.mtime is None:
        drift.append(Drift('%s: content not hashed (%s)' % (path, why), path, 'sha1', spec.sha1, None))
    return drift


def file_drift(spec):
    """Drift lines for one FileSpec (empty when the path matches)."""
    return compare_file(spec, observe_file(spec.path, want_sha1=spec.sha1 is not None or spec.read_sha1,
                                           want_entries=spec.entries is not None))


def observe_user(name):
    """None when the user is missing, else its primary group (by name; the gid as a string when
    no group has it), shell and home."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    try:
        group = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        group = str(entry.pw_gid)
    return {'group': group, 'shell': entry.pw_shell, 'home': entry.pw_dir}


def group_exists(name):
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


def user_drift(spec, seen):
    """What differs between a UserSpec and observe_user()'s answer (None: missing)."""
    if not seen:
        return [Drift('user %s: missing' % spec.name, 'user ' + spec.name, 'state', 'present', 'missing')]
    return [Drift('user %s: %s %s, want %s' % (spec.name, key, seen.get(key), getattr(spec, key)),
                  'user ' + spec.name, key, getattr(spec, key), seen.get(key))
            for key in USER_ATTRIBUTES
            if getattr(spec, key) is not None and seen.get(key) != getattr(spec, key)]


def group_drift(name, exists):
    return [] if exists else [Drift('group %s: missing' % name, 'group ' + name, 'state', 'present', 'missing')]


# -- systemd units -------------------------------------------------------------------------

def systemctl_show_command(systemctl, unit_names):
    return [systemctl, 'show', '--property=' + ','.join(UNIT_PROPERTIES), '--'] + list(unit_names)


def parse_systemctl_show(text):
    """`systemctl show` output -> one {property: value} dict per blank-line separated block,
    in the order printed (the order of the unit arguments)."""
    blocks = []
    current = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition('=')
        if sep:
            current[key] = value
    if current:
        blocks.append(current)
    return blocks


def unit_states_from_show(unit_names, text):
    """Pair the blocks of `systemctl show` output with the unit names asked for, in order.
    A count that does not match (nothing can be paired safely) makes every unit unreadable."""
    blocks = parse_systemctl_show(text)
    if len(blocks) != len(unit_names) or not all('LoadState' in b for b in blocks):
        reason = 'systemctl show printed %d unit block(s) for %d unit(s)' % (len(blocks), len(unit_names))
        return dict((name, UnitState(name=name, error=reason)) for name in unit_names)
    return dict((name, UnitState(name=name, properties=block)) for name, block in zip(unit_names, blocks))


def find_command(name):
    """``name`` on the module's PATH or, when that PATH is minimal, in the system directories."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get('PATH', ''), SYSTEM_PATH]))


def find_systemctl():
    return find_command('systemctl')


def read_unit_states(unit_names, systemctl=None, run_command=None):
    """Every unit's state through ONE `systemctl show` call, run by ``run_command``
    (module_command_runner). systemctl missing or failing is not an error of the module: every
    unit gets the reason as its ``error``."""
    unit_names = list(unit_names)
    if not unit_names:
        return {}
    systemctl = systemctl or find_systemctl()
    reason = None
    if not systemctl:
        reason = 'systemctl not found'
    else:
        try:
            rc, stdout, stderr = run_bounded(run_command, systemctl_show_command(systemctl, unit_names),
                                             SYSTEMCTL_TIMEOUT_SECONDS)
        except CommandNotRun as exc:
            reason = 'systemctl show could not run (%s)' % exc
        else:
            if rc != 0:
                detail = (stderr.strip() or stdout.strip()).splitlines()
                reason = 'systemctl show failed (rc %d%s)' % (rc, ': ' + detail[0] if detail else '')
            else:
                return unit_states_from_show(unit_names, stdout)
    return dict((name, UnitState(name=name, error=reason)) for name in unit_names)


def _shown(value):
    return value if value else 'empty'


def unit_drift(spec, state):
    """Drift lines for one UnitSpec given its UnitState."""
    name = spec.name
    if state.error:
        return [Drift('%s: state unknown (%s)' % (name, state.error), name, 'state', 'readable', None)]
    drift = []
    if state.get('NeedDaemonReload') == 'yes':
        drift.append(Drift('%s: unit file changed on disk, needs daemon-reload' % name,
                           name, 'NeedDaemonReload', 'no', 'yes'))
    load_state = state.get('LoadState')
    if (spec.enabled or spec.active) and load_state != 'loaded':
        drift.append(Drift('%s: LoadState %s, wanted loaded' % (name, _shown(load_state)),
                           name, 'LoadState', 'loaded', load_state))
    unit_file_state = state.get('UnitFileState')
    if spec.enabled is True and unit_file_state != ENABLED_AT_BOOT_UNIT_FILE_STATE:
        drift.append(Drift('%s: not enabled (UnitFileState %s)' % (name, _shown(unit_file_state)),
                           name, 'UnitFileState', ENABLED_AT_BOOT_UNIT_FILE_STATE, unit_file_state))
    elif spec.enabled is False and unit_file_state in ENABLED_UNIT_FILE_STATES:
        drift.append(Drift('%s: enabled (UnitFileState %s), wanted not enabled' % (name, unit_file_state),
                           name, 'UnitFileState', 'not enabled', unit_file_state))
    active_state = state.get('ActiveState')
    described = '%s (%s)' % (_shown(active_state), _shown(state.get('SubState')))
    if spec.active is True and active_state != 'active':
        drift.append(Drift('%s: ActiveState %s, wanted active' % (name, described),
                           name, 'ActiveState', 'active', active_state))
    elif spec.active is False and active_state in RUNNING_ACTIVE_STATES:
        drift.append(Drift('%s: ActiveState %s, wanted not active' % (name, described),
                           name, 'ActiveState', 'not active', active_state))
    return drift


# -- http ----------------------------------------------------------------------------------

def http_status(url, timeout):
    """(status, None) for any HTTP answer, redirects and errors included (a redirect is an answer
    to compare, not a place to go); (None, reason) when no answer came within ``timeout`` seconds
    in all (refused, timeout, TLS failure). Direct connection, no proxies; the body is not read."""
    parts = urllib.parse.urlsplit(url)
    deadline = Deadline(timeout)
    try:
        port = parts.port
    except ValueError:
        return None, 'the URL has an invalid port'
    if parts.scheme not in ('http', 'https') or not parts.hostname:
        return None, 'not an http(s) URL'
    connection_class = http.client.HTTPSConnection if parts.scheme == 'https' else http.client.HTTPConnection
    connection = connection_class(parts.hostname, port, timeout=timeout)
    try:
        deadline.connect(connection)
        connection.request('GET', (parts.path or '/') + ('?' + parts.query if parts.query else ''),
                           headers={'Accept-Encoding': 'identity'})
        return connection.getresponse().status, None
    except socket.timeout:
        return None, 'timed out after %gs' % timeout
    except OSError as exc:
        if deadline.expired:
            return None, 'timed out after %gs' % timeout
        return None, exc.strerror or type(exc).__name__
    except Exception as exc:  # e.g. a malformed status line: still no status to compare
        return None, '%s: %s' % (type(exc).__name__, exc)
    finally:
        connection.close()


def http_drift(spec, answer):
    """Drift lines for one HttpSpec given the (status, reason) http_status() observed."""
    status, reason = answer
    if status is None:
        return [Drift('%s: no answer (%s), wanted status %d' % (spec.url, reason, spec.status),
                      spec.url, 'status', spec.status, None)]
    if status != spec.status:
        return [Drift('%s: status %d, wanted %d' % (spec.url, status, spec.status), spec.url, 'status', spec.status, status)]
    return []


# -- python packages -----------------------------------------------------------------------

def installed_versions(python, names, run_command=None):
    """({name: version or None}, None) as `python` sees its packages, or (None, reason) when
    the interpreter is missing or does not answer. One subprocess for all names."""
    if not os.path.exists(python):
        return None, 'interpreter missing'
    try:
        # -I: the interpreter's own packages only, not PYTHONPATH or the user's site dir.
        rc, stdout, stderr = run_bounded(run_command, [python, '-I', '-c', PACKAGE_VERSIONS_SCRIPT] + list(names),
                                         PYTHON_TIMEOUT_SECONDS)
    except CommandNotRun as exc:
        return None, 'interpreter did not run (%s)' % exc
    if rc != 0:
        detail = stderr.strip().splitlines()
        return None, 'interpreter failed (rc %d%s)' % (rc, ': ' + detail[-1] if detail else '')
    try:
        found = json.loads(stdout)
    except ValueError:
        return None, 'interpreter printed no version list'
    if not isinstance(found, dict):
        return None, 'interpreter printed no version list'
    return found, None


def package_drift(spec, found, reason):
    """Drift lines for one PythonPackageSpec given its interpreter's {name: version} (or the
    reason it gave none)."""
    what = '%s %s in %s' % (spec.name, spec.version or '(any version)', spec.python)
    obj = '%s in %s' % (spec.name, spec.python)
    if found is None:
        return [Drift('%s: %s' % (what, reason), obj, 'version', spec.version, None)]
    if found.get(spec.name) is None:
        return [Drift('%s: not installed' % what, obj, 'state', 'present', 'missing')]
    if spec.version is not None and found[spec.name] != spec.version:
        return [Drift('%s: installed %s' % (what, found[spec.name]), obj, 'version', spec.version, found[spec.name])]
    return []


def observe_python_packages(specs, run_command=None):
    """{python: {'versions': {name: version or None}} or {'error': reason}}, one interpreter
    run per distinct interpreter."""
    by_python = {}
    for spec in specs:
        by_python.setdefault(spec.python, []).append(spec.name)
    seen = {}
    for python, names in by_python.items():
        found, reason = installed_versions(python, list(dict.fromkeys(names)), run_command=run_command)
        seen[python] = {'versions': found} if found is not None else {'error': reason}
    return seen


def python_package_drift(specs, run_command=None):
    """Drift lines for PythonPackageSpecs, one interpreter run per distinct interpreter."""
    seen = observe_python_packages(specs, run_command=run_command)
    return dict((spec, package_drift(spec, seen[spec.python].get('versions'), seen[spec.python].get('error')))
                for spec in specs)


# -- all checks ----------------------------------------------------------------------------

def observe(checks, systemctl=None, run_command=None):
    """Everything the checks name, read from this node as JSON-able data (no comparison, no
    file contents): what crosses the wire when the comparison runs on the controller
    (gpu_facts' ``observe``). systemctl is read once for all units, each interpreter once; both
    run by ``run_command`` (module_command_runner), needed when a check names units or packages."""
    files = {}
    budget = HashBudget()   # one for the whole call: bytes and seconds spent hashing
    for check in checks:
        for spec in check.files:
            want_sha1 = spec.sha1 is not None or spec.read_sha1
            want_entries = spec.entries is not None
            seen = files.get(spec.path)
            hashed = bool(seen and ('sha1' in seen or 'sha1_skipped' in seen))
            if seen is None or (want_sha1 and not hashed) or (want_entries and 'entries' not in seen):
                files[spec.path] = observe_file(spec.path, want_sha1=want_sha1 or hashed,
                                                want_entries=want_entries or bool(seen and 'entries' in seen),
                                                budget=budget)
    http = {}
    for check in checks:
        for spec in check.http:
            if spec.url not in http:
                status, reason = http_status(spec.url, spec.timeout)
                http[spec.url] = {'status': status, 'error': reason}
    # The units after the URLs: a service that answered and died right after shows as not active.
    unit_names = list(dict.fromkeys(unit.name for check in checks for unit in check.units))
    units = dict((name, {'properties': dict(state.properties), 'error': state.error})
                 for name, state in read_unit_states(unit_names, systemctl=systemctl,
                                                     run_command=run_command).items())
    return dict(
        files=files,
        users=dict((spec.name, observe_user(spec.name)) for check in checks for spec in check.users),
        groups=dict((name, group_exists(name)) for check in checks for name in check.groups),
        units=units,
        http=http,
        python_packages=observe_python_packages([spec for check in checks for spec in check.python_packages],
                                                run_command=run_command),
    )


def compare(checks, observation):
    """Compare every CheckSpec with an observation of the node (observe()'s data, possibly
    after a JSON round trip). Anything a check names that was not observed is drift.
    Returns CheckResults in check order."""
    files = observation.get('files') or {}
    users = observation.get('users') or {}
    groups = observation.get('groups') or {}
    units = observation.get('units') or {}
    http = observation.get('http') or {}
    packages = observation.get('python_packages') or {}
    not_observed = {'error': 'not observed'}

    results = []
    for check in checks:
        result = CheckResult(name=check.name)
        for spec in check.files:
            result.drift.extend(compare_file(spec, files.get(spec.path)))
        for spec in check.users:
            seen = users.get(spec.name)
            result.drift.extend(user_drift(spec, seen if isinstance(seen, dict) else None))
        for name in check.groups:
            result.drift.extend(group_drift(name, bool(groups.get(name))))
        for spec in check.units:
            seen = units.get(spec.name, not_observed)
            result.drift.extend(unit_drift(spec, UnitState(name=spec.name, properties=seen.get('properties') or {},
                                                           error=seen.get('error'))))
        for spec in check.http:
            seen = http.get(spec.url, {'status': None, 'error': 'not observed'})
            result.drift.extend(http_drift(spec, (seen.get('status'), seen.get('error'))))
        for spec in check.python_packages:
            seen = packages.get(spec.python, not_observed)
            result.drift.extend(package_drift(spec, seen.get('versions'), seen.get('error')))
        results.append(result)
    return results


def evaluate(checks, systemctl=None, run_command=None):
    """Compare every CheckSpec with this node: observe, then compare. Returns CheckResults
    in check order."""
    return compare(checks, observe(checks, systemctl=systemctl, run_command=run_command))


# Bounds of a wait (evaluate_until_in_sync): a worker's health wait is minutes, never hours.
MAX_WAIT_SECONDS = 3600
MIN_WAIT_DELAY_SECONDS = 0.1
MAX_WAIT_DELAY_SECONDS = 300


class NodeStateWaitError(ValueError):
    """A wait_timeout or wait_delay out of range: names the option and the value."""

    def __init__(self, field_name, value, problem):
        super().__init__('%s %r: %s' % (field_name, value, problem))
        self.field = field_name


def check_wait(timeout, delay):
    """``(timeout, delay)`` as floats, or NodeStateWaitError naming the option."""
    for name, value, low, high in (('wait_timeout', timeout, 0, MAX_WAIT_SECONDS),
                                   ('wait_delay', delay, MIN_WAIT_DELAY_SECONDS, MAX_WAIT_DELAY_SECONDS)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or not low <= value <= high:
            raise NodeStateWaitError(name, value, 'must be %s..%s seconds' % (low, high))
    return float(timeout), float(delay)


def evaluate_until_in_sync(checks, timeout, delay, systemctl=None, clock=time.monotonic, sleep=time.sleep,
                           run_command=None):
    """evaluate() again every ``delay`` seconds until every check is in sync or ``timeout``
    seconds have passed since the first try (one try when ``timeout`` is 0): a health wait in
    one round trip, where the controller would otherwise poll with a remote call per try.
    Returns (CheckResults of the last try, tries, seconds waited)."""
    started = clock()
    tries = 0
    while True:
        results = evaluate(checks, systemctl=systemctl, run_command=run_command)
        tries += 1
        waited = clock() - started
        if all(r.in_sync for r in results) or waited + delay > timeout:
            return results, tries, waited
        sleep(delay)


def summarize(results):
    """CheckResults -> the module's return values: in_sync, checks, drift, drift_items. The
    lines are plain strings (for people); what a role decides on is ``drift_items`` (per check,
    or all of them with the ``check`` each came from)."""
    return dict(
        in_sync=all(r.in_sync for r in results),
        checks=dict((r.name, dict(in_sync=r.in_sync, drift=[str(line) for line in r.drift],
                                  drift_items=r.drift_items)) for r in results),
        drift=['%s: %s' % (r.name, line) for r in results for line in r.drift],
        drift_items=[dict(item, check=r.name) for r in results for item in r.drift_items],
    )
