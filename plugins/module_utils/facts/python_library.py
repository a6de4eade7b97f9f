# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A pure-Python library kept on the node as an unpacked wheel, for a module that cannot import it
from the node's own Python: gpu_facts and pynvml (nvidia-ml-py).

Why not ``pip install``: nodes may have no route to PyPI, Debian 12 marks the system Python
externally managed, and copying the wheel, installing it and probing again cost a cold node
three round trips more than sending the wheel with the second probe, which unpacks it here and
imports it. Unpacked, not imported from the zip: a zip import compiles pynvml.py (330 KB) on
every probe, an unpacked copy keeps its bytecode in ``__pycache__`` (0.16 s against 0.05 s per
import, measured on the lab machine).

What is imported is code run as the module's user (root on a fleet), so a copy is used only
when the library directory, the unpacked directory and the module file are owned by root or
that user, writable by no one else, and not symbolic links. A wheel sent by the controller is
bounded in size and member count, must be pure Python (``py3-none-any``), and its members must
stay inside the directory they are unpacked into.

Stdlib only and Python >= 3.8: this runs on the managed node.
"""


import base64
import binascii
import importlib.util
import io
import os
import re
import shutil
import stat
import sys
import tempfile
import zipfile

# Where gpu_facts keeps libraries it was sent (its library_dir option's default).
LIBRARY_DIR_DEFAULT = '/var/lib/kvpin/python'
# nvidia-ml-py's wheel is 58 KB, pynvml.py 330 KB: far above both, far below a memory problem.
WHEEL_MAX_BYTES = 16 * 1024 * 1024
UNPACKED_MAX_BYTES = 64 * 1024 * 1024
WHEEL_MAX_MEMBERS = 1000
# Pure-Python wheels only (PEP 427 file name): nothing compiled for another platform gets in.
WHEEL_NAME_RE = re.compile(r'^(?P<stem>(?P<dist>[A-Za-z0-9_.]+?)-(?P<version>[0-9][A-Za-z0-9.+!_]*))'
                           r'-py3-none-any\.whl$')
UNPACKED_NAME_RE = re.compile(r'^(?P<dist>[A-Za-z0-9_.]+?)-(?P<version>[0-9][A-Za-z0-9.+!_]*)$')


class PythonLibraryError(ValueError):
    """Bad input or an unusable library, with the field it is about."""

    def __init__(self, field, problem):
        super(PythonLibraryError, self).__init__('%s: %s' % (field, problem))
        self.field = field
        self.problem = problem


def wheel_distribution(distribution):
    """The distribution's name as wheel file names spell it (PEP 427): nvidia-ml-py -> nvidia_ml_py."""
    return re.sub(r'[-_.]+', '_', distribution).lower()


def version_key(version):
    """Sort key for a version string: numeric parts compare as numbers (13.615.71 > 13.615.9)."""
    key = []
    for part in re.split(r'[.+!_]', version):
        key.append((1, int(part), '') if part.isdigit() else (0, 0, part))
    return tuple(key)


def untrusted_reason(path, want_dir):
    """Why ``path`` must not be imported from (None when it may): a symbolic link, the wrong kind,
    owned by neither root nor this user, or writable by group or others."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return '%s: %s' % (path, exc.strerror or exc)
    if stat.S_ISLNK(st.st_mode):
        return '%s is a symbolic link' % path
    if want_dir and not stat.S_ISDIR(st.st_mode):
        return '%s is not a directory' % path
    if not want_dir and not stat.S_ISREG(st.st_mode):
        return '%s is not a regular file' % path
    if st.st_uid not in (0, os.geteuid()):
        return '%s is owned by uid %d, not root or this user' % (path, st.st_uid)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return '%s is writable by group or others (mode %04o)' % (path, stat.S_IMODE(st.st_mode))
    return None


def find_unpacked(library_dir, distribution, module_name):
    """The newest trusted unpacked copy of ``distribution`` in ``library_dir`` that holds
    ``<module_name>.py``: (module file path, None), or (None, why there is none)."""
    if not os.path.isdir(library_dir):
        return None, 'no %s in %s (no such directory)' % (distribution, library_dir)
    reason = untrusted_reason(library_dir, want_dir=True)
    if reason:
        return None, reason
    wanted = wheel_distribution(distribution)
    candidates = []
    try:
        names = os.listdir(library_dir)
    except OSError as exc:
        return None, 'cannot list %s: %s' % (library_dir, exc.strerror or exc)
    for name in names:
        match = UNPACKED_NAME_RE.match(name)
        if match and wheel_distribution(match.group('dist')) == wanted:
            candidates.append((version_key(match.group('version')), name))
    if not candidates:
        return None, 'no %s in %s' % (distribution, library_dir)
    return trusted_copy(library_dir, max(candidates)[1], module_name)


def trusted_copy(library_dir, stem, module_name):
    """``library_dir/stem/<module_name>.py`` when the directory, the copy and the file may be
    imported from: (module file path, None), or (None, why not)."""
    unpacked = os.path.join(library_dir, stem)
    module_file = os.path.join(unpacked, module_name + '.py')
    reason = (untrusted_reason(library_dir, want_dir=True) or untrusted_reason(unpacked, want_dir=True)
              or untrusted_reason(module_file, want_dir=False))
    return (None, reason) if reason else (module_file, None)


def _wheel_members(archive, field):
    """The wheel's file members, checked: bounded count and size, relative paths that stay inside."""
    infos = archive.infolist()
    if len(infos) > WHEEL_MAX_MEMBERS:
        raise PythonLibraryError(field, 'the wheel has %d members, more than %d' % (len(infos), WHEEL_MAX_MEMBERS))
    total = 0
    members = []
    for info in infos:
        name = info.filename
        parts = name.split('/')
        if name.startswith('/') or '\\' in name or '..' in parts or ':' in parts[0]:
            raise PythonLibraryError(field, 'the wheel member %r leaves the directory it is unpacked into' % name)
        if stat.S_ISLNK(info.external_attr >> 16):
            raise PythonLibraryError(field, 'the wheel member %r is a symbolic link' % name)
        if name.endswith('/'):
            continue
        total += info.file_size
        if total > UNPACKED_MAX_BYTES:
            raise PythonLibraryError(field, 'the wheel unpacks to more than %d bytes' % UNPACKED_MAX_BYTES)
        members.append(info)
    return members


def parse_wheel(name, content, distribution, module_name):
    """Check a wheel sent as ``name`` and base64 ``content``: returns (stem, bytes). Raises
    PythonLibraryError naming library_wheel.name or library_wheel.content; never quotes the content."""
    if not isinstance(name, str) or not WHEEL_NAME_RE.match(name):
        raise PythonLibraryError('library_wheel.name', '%r is not a pure-Python wheel file name '
                                 '(<distribution>-<version>-py3-none-any.whl)' % (name,))
    match = WHEEL_NAME_RE.match(name)
    if wheel_distribution(match.group('dist')) != wheel_distribution(distribution):
        raise PythonLibraryError('library_wheel.name', '%s is not a wheel of %s' % (name, distribution))
    if not isinstance(content, str):
        raise PythonLibraryError('library_wheel.content', 'must be base64 text, got %s' % type(content).__name__)
    if len(content) > (WHEEL_MAX_BYTES // 3 + 1) * 4:
        raise PythonLibraryError('library_wheel.content', 'more than %d bytes once decoded' % WHEEL_MAX_BYTES)
    try:
        data = base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise PythonLibraryError('library_wheel.content', 'is not valid base64')
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = _wheel_members(archive, 'library_wheel.content')
    except zipfile.BadZipFile:
        raise PythonLibraryError('library_wheel.content', 'is not a wheel (not a zip archive)')
    if module_name + '.py' not in [info.filename for info in members]:
        raise PythonLibraryError('library_wheel.content', '%s has no top-level %s.py' % (name, module_name))
    return match.group('stem'), data


def unpack_wheel(data, parent_dir, stem):
    """Unpack a checked wheel into ``parent_dir/stem`` (replacing what is there) through a temporary
    directory renamed into place: a reader sees the old copy or the whole new one. Directories
    0755, files 0644. Returns the unpacked directory."""
    tmp = tempfile.mkdtemp(prefix='.%s.' % stem, dir=parent_dir)
    try:
        os.chmod(tmp, 0o755)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for info in _wheel_members(archive, 'library_wheel.content'):
                target = os.path.join(tmp, *info.filename.split('/'))
                os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
                with archive.open(info) as src:
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, 'O_NOFOLLOW', 0), 0o644)
                    with os.fdopen(fd, 'wb') as dst:
                        shutil.copyfileobj(src, dst)
                os.chmod(target, 0o644)
        final = os.path.join(parent_dir, stem)
        if os.path.lexists(final):
            old = tempfile.mkdtemp(prefix='.%s.old.' % stem, dir=parent_dir)
            os.rename(final, os.path.join(old, stem))
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        return final
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ensure_library_dir(library_dir):
    """Create ``library_dir`` (0755) if missing; refuse one that may not be imported from."""
    if not os.path.isdir(library_dir):
        os.makedirs(library_dir, mode=0o755, exist_ok=True)
        os.chmod(library_dir, 0o755)
    reason = untrusted_reason(library_dir, want_dir=True)
    if reason:
        raise PythonLibraryError('library_dir', reason)


def load_module_file(module_name, path):
    """Import ``path`` as ``module_name`` (registered in sys.modules, bytecode cached next to it)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError('cannot load %s from %s' % (module_name, path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module
