# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the serving engines keep their compile caches on a node, and the environment that
points them there: the one place for these variable names.

Why it matters for memory, not only start time: vLLM sizes an unpinned KV pool from a profile
run, and a cold torch.compile during that run is charged as activation peak, so a cold start
gets less KV than a warm one (vllm#54383: 4.5 % on 2 x RTX 4090). A recycled instance is
warm only if the cache it wrote before survives, i.e. lives on a persistent directory both
runtimes can reach:

- ``VLLM_CACHE_ROOT`` (vllm/envs.py; default ``~/.cache/vllm``, or ``$XDG_CACHE_HOME/vllm``):
  vLLM's compiled graphs go to ``torch_compile_cache/<hash>/rank_<i>_<j>`` below it, and
  vLLM points TorchInductor and Triton into that directory while it compiles
  (``InductorAdaptor.initialize_cache`` in vllm/compilation/compiler_interface.py).
- ``TORCHINDUCTOR_CACHE_DIR`` (torch/_inductor/runtime/cache_dir_utils.py; default
  ``/tmp/torchinductor_<user>``) and ``TRITON_CACHE_DIR`` (default ``~/.triton/cache``): what
  the engine compiles outside vLLM's own cache (kernels built before the model compile).

The defaults are all wrong for a GPUStack worker: the native unit runs with ``ProtectHome=yes``
and ``PrivateTmp=yes`` (root's home hidden, a fresh /tmp per start) and an engine container
starts from a fresh filesystem. GPUStack 2.2+ itself sets ``VLLM_CACHE_ROOT=<cache_dir>/vllm``
for vLLM containers when the model's env does not (gpustack/worker/backends/vllm.py
``_set_cache_env``, commit aaa18b61); the role's default root is that ``cache_dir``, so both
name the same directory.
"""

from __future__ import annotations

import posixpath
import re

# Variable -> subdirectory of the cache root it points at.
COMPILE_CACHE_ENV = (
    ('VLLM_CACHE_ROOT', 'vllm'),
    ('TORCHINDUCTOR_CACHE_DIR', 'inductor'),
    ('TRITON_CACHE_DIR', 'triton'),
)
# Characters a path may hold: it goes unquoted into a systemd unit (ReadWritePaths=, and the
# docker/podman --volume SRC:DST of ExecStart=), where whitespace splits, ':' separates, '%'
# is a specifier, '$' expands and quotes or backslashes are unquoted.
_SAFE_PATH = re.compile(r'^/[A-Za-z0-9._+@/-]*$')
# Not persistent across a reboot or a unit restart (tmpfs, PrivateTmp), or not the place for it.
_NOT_PERSISTENT = ('/tmp', '/var/tmp', '/run', '/dev', '/proc', '/sys')
MAX_PATH_BYTES = 1024


class CompileCacheError(ValueError):
    """A cache root the role cannot use; ``field`` is the variable at fault."""

    def __init__(self, field, message):
        super().__init__('%s: %s' % (field, message))
        self.field = field


def _shown(path):
    text = path.encode('unicode_escape').decode('ascii')
    return repr(text if len(text) <= 120 else text[:117] + '...')


def check_cache_root(root, field):
    """``root`` if it is an absolute, normalised, persistent directory path other than '/'."""
    if not isinstance(root, str):
        raise CompileCacheError(field, 'must be a path (a string), got %s' % type(root).__name__)
    if not root:
        raise CompileCacheError(field, 'must not be empty (an absolute directory such as /var/lib/gpustack/cache)')
    if len(root.encode('utf-8', 'replace')) > MAX_PATH_BYTES:
        raise CompileCacheError(field, 'is longer than %d bytes' % MAX_PATH_BYTES)
    if any(ord(char) < 32 or ord(char) == 127 for char in root):
        raise CompileCacheError(field, '%s holds a control character (newline, tab, ...): it would end '
                                       'a line of the unit and the environment file' % _shown(root))
    if not root.startswith('/'):
        raise CompileCacheError(field, '%s is relative: the engines run in another working directory '
                                       '(and container); give an absolute path' % _shown(root))
    if not _SAFE_PATH.match(root):
        raise CompileCacheError(field, '%s holds a character a systemd unit or a volume argument would '
                                       'split or expand (allowed: letters, digits, . _ + @ - /)' % _shown(root))
    if posixpath.normpath(root) != root or root.startswith('//'):
        raise CompileCacheError(field, '%s is not normalised (., .., // or a trailing /); write %s'
                                % (_shown(root), _shown(posixpath.normpath(root))))
    if root == '/':
        raise CompileCacheError(field, "'/' is the root of the filesystem: the role would make it 0750 "
                                       "and mount it into the worker; give a directory of its own")
    for volatile in _NOT_PERSISTENT:
        if root == volatile or root.startswith(volatile + '/'):
            raise CompileCacheError(field, '%s is under %s, which does not survive a restart (or is '
                                           'private to the unit); the cache must persist' % (_shown(root), volatile))
    return root


def compile_cache(root, field='compile_cache_dir'):
    """{'root', 'dirs', 'env'}: the checked root, the directories the engines write (one
    ``{'path': ...}`` per variable, in COMPILE_CACHE_ENV order, the form of a role's table of
    managed files) and the environment that points them there."""
    root = check_cache_root(root, field)
    dirs = [{'path': posixpath.join(root, sub)} for _name, sub in COMPILE_CACHE_ENV]
    env = dict((name, posixpath.join(root, sub)) for name, sub in COMPILE_CACHE_ENV)
    return {'root': root, 'dirs': dirs, 'env': env}
