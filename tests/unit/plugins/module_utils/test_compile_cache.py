# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engines' compile-cache root: the environment and directories derived from it, and every
root the worker role cannot use refused naming the variable (module_utils/compile_cache.py and
its filter)."""
from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.compile_cache import (
    COMPILE_CACHE_ENV, CompileCacheError, compile_cache)

FIELD = 'gpustack_worker_compile_cache_dir'
FILTER = FilterModule().filters()['kvpin_compile_cache']


def test_env_and_dirs_under_the_root():
    cache = compile_cache('/var/lib/gpustack/cache', FIELD)
    assert cache == {
        'root': '/var/lib/gpustack/cache',
        'dirs': [{'path': '/var/lib/gpustack/cache/vllm'}, {'path': '/var/lib/gpustack/cache/inductor'},
                 {'path': '/var/lib/gpustack/cache/triton'}],
        'env': {'VLLM_CACHE_ROOT': '/var/lib/gpustack/cache/vllm',
                'TORCHINDUCTOR_CACHE_DIR': '/var/lib/gpustack/cache/inductor',
                'TRITON_CACHE_DIR': '/var/lib/gpustack/cache/triton'}}
    # the one table of names: every variable gets its own directory
    assert [name for name, _sub in COMPILE_CACHE_ENV] == list(cache['env'])
    assert len({d['path'] for d in cache['dirs']}) == len(COMPILE_CACHE_ENV)


def test_vllm_cache_root_matches_what_gpustack_2_2_picks_by_default():
    # gpustack/worker/backends/vllm.py _set_cache_env: os.path.join(cache_dir, "vllm")
    assert compile_cache('/var/lib/gpustack/cache', FIELD)['env']['VLLM_CACHE_ROOT'] == '/var/lib/gpustack/cache/vllm'


@pytest.mark.parametrize('root, why', [
    ('relative/cache', 'is relative'),
    ('./cache', 'is relative'),
    ('~/cache', 'is relative'),
    ('/srv/cache\n', 'control character'),
    ('/srv/ca\nche', 'control character'),
    ('/srv/ca\tche', 'control character'),
    ('/srv/ca\x7fche', 'control character'),
    ('/', "'/' is the root of the filesystem"),
    ('//', 'not normalised'),
    ('/srv/cache/', 'not normalised'),
    ('/srv//cache', 'not normalised'),
    ('/srv/./cache', 'not normalised'),
    ('/srv/../cache', 'not normalised'),
    ('/srv/my cache', 'would split or expand'),
    ('/srv/cache:/etc', 'would split or expand'),
    ('/srv/%n', 'would split or expand'),
    ('/srv/$HOME', 'would split or expand'),
    ('/srv/"x"', 'would split or expand'),
    ('/srv/cache\\', 'would split or expand'),
    ('/srv/caché', 'would split or expand'),
    ('/tmp', 'under /tmp'),
    ('/tmp/vllm', 'under /tmp'),
    ('/var/tmp/x', 'under /var/tmp'),
    ('/run/vllm', 'under /run'),
    ('/dev/shm/vllm', 'under /dev'),
    ('/proc/self', 'under /proc'),
    ('', 'must not be empty'),
    ('/' + 'a' * 1100, 'longer than 1024 bytes'),
])
def test_a_root_the_role_cannot_use_is_refused_naming_the_field(root, why):
    with pytest.raises(CompileCacheError) as err:
        compile_cache(root, FIELD)
    assert err.value.field == FIELD
    assert str(err.value).startswith(FIELD + ': ') and why in str(err.value)
    # a newline never reaches the message raw (it would split a log line)
    assert '\n' not in str(err.value)


@pytest.mark.parametrize('root', [None, 5, ['/srv'], {'path': '/srv'}, True])
def test_a_root_that_is_not_a_string_is_refused(root):
    with pytest.raises(CompileCacheError, match='must be a path'):
        compile_cache(root, FIELD)


def test_tmp_lookalikes_are_accepted():
    # only /tmp itself and below it are volatile; /tmpfs-backup or /srv/tmp are ordinary paths
    assert compile_cache('/tmpcache', FIELD)['root'] == '/tmpcache'
    assert compile_cache('/srv/tmp', FIELD)['root'] == '/srv/tmp'


def test_the_filter_names_itself_and_the_variable():
    assert FILTER('/srv/cc', FIELD)['env']['TRITON_CACHE_DIR'] == '/srv/cc/triton'
    with pytest.raises(AnsibleFilterError, match='^kvpin_compile_cache: gpustack_worker_compile_cache_dir: '):
        FILTER('relative', FIELD)
