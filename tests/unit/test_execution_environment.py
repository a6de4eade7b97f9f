# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""ee/execution-environment.yml through ``ansible-builder create`` (no image build): the build
context carries the collection built from this checkout, ansible-core and ansible-runner at the
pins of requirements.txt, the base image, and a wheelhouse-only pip; and ansible-builder's own
introspection of the installed collection yields the Python pins requirements.txt has for
nvidia-ml-py and gguf (meta/execution-environment.yml -> meta/ee-requirements.txt)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)


def pins(path):
    with open(path, encoding='utf-8') as handle:
        return dict(line.strip().split('==', 1) for line in handle if re.match(r'^[A-Za-z0-9_.-]+==', line))


REQUIREMENTS = pins(os.path.join(ROOT, 'requirements.txt'))


@pytest.fixture(scope='module')
def context(tmp_path_factory):
    """ansible-builder create over a copy of ee/ whose build/ holds this checkout's tarball and
    an empty wheelhouse (what scripts/ee.sh puts there; create reads no wheel)."""
    work = tmp_path_factory.mktemp('ee')
    for name in ('execution-environment.yml', 'requirements.yml'):
        shutil.copy(os.path.join(ROOT, 'ee', name), str(work / name))
    (work / 'build' / 'wheelhouse').mkdir(parents=True)
    files = subprocess.run(['git', '-C', ROOT, 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                           capture_output=True, check=True, timeout=60).stdout.decode().split('\0')
    src = work / 'src'
    for path in (p for p in files if p and os.path.isfile(os.path.join(ROOT, p))):
        os.makedirs(str((src / path).parent), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), str(src / path))
    subprocess.run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'build', str(src), '--output-path', str(work)],
                   capture_output=True, check=True, timeout=120)
    tarball = next(work.glob('kvpin-fleet-*.tar.gz'))
    tarball.rename(work / 'build' / 'kvpin-fleet.tar.gz')
    proc = subprocess.run([os.path.join(BIN, 'ansible-builder'), 'create', '-f', str(work / 'execution-environment.yml'),
                           '-c', str(work / 'context'), '--output-filename', 'Containerfile'],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return work / 'context'


def test_the_containerfile_installs_the_pinned_ansible_from_the_wheelhouse_only(context):
    text = (context / 'Containerfile').read_text()
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="(.*)"$', text, re.M).group(1).split()
    assert refs == ['ansible-core==%s' % REQUIREMENTS['ansible-core'], 'ansible-runner==%s' % REQUIREMENTS['ansible-runner']]
    assert 'ARG EE_BASE_IMAGE="localhost/kvpin-node:bookworm"' in text
    # Every stage that runs pip reads the wheelhouse and no index (the build runs with no network).
    for stage in ('base', 'builder', 'final'):
        body = text.split('AS %s\n' % stage, 1)[1].split('\nFROM ', 1)[0]
        assert 'PIP_NO_INDEX=1 PIP_FIND_LINKS=/kvpin-wheelhouse' in body, stage
    base = text.split('AS base\n', 1)[1]
    assert base.index('PIP_NO_INDEX=1') < base.index('RUN $PYCMD -m pip install --no-cache-dir $ANSIBLE_INSTALL_REFS')
    assert 'ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml' in text


def test_the_context_carries_this_checkouts_collection(context):
    requirements = yaml.safe_load((context / '_build' / 'requirements.yml').read_text())
    assert requirements == {'collections': [{'name': '/kvpin-collections/kvpin-fleet.tar.gz', 'type': 'file'}]}
    with tarfile.open(str(context / '_build' / 'collections' / 'kvpin-fleet.tar.gz')) as tar:
        manifest = json.load(tar.extractfile('MANIFEST.json'))['collection_info']
        names = set(tar.getnames())
        shipped = tar.extractfile('meta/ee-requirements.txt').read().decode()
    with open(os.path.join(ROOT, 'galaxy.yml'), encoding='utf-8') as handle:
        galaxy = yaml.safe_load(handle)
    assert (manifest['namespace'], manifest['name'], manifest['version']) == (
        galaxy['namespace'], galaxy['name'], galaxy['version'])
    assert {'meta/execution-environment.yml', 'plugins/modules/gpu_facts.py', 'playbooks/site.yml'} <= names
    with open(os.path.join(ROOT, 'meta', 'ee-requirements.txt'), encoding='utf-8') as handle:
        assert shipped == handle.read()


def test_ansible_builders_introspection_of_the_collection_gives_the_pinned_python_deps(context, tmp_path):
    """What the builder stage computes: install the tarball, run the context's introspect.py."""
    subprocess.run([os.path.join(BIN, 'ansible-galaxy'), 'collection', 'install', '--force', '-p', str(tmp_path / 'coll'),
                    str(context / '_build' / 'collections' / 'kvpin-fleet.tar.gz')],
                   capture_output=True, check=True, timeout=120, env=dict(os.environ, HOME=str(tmp_path)))
    out = tmp_path / 'requirements.txt'
    proc = subprocess.run([sys.executable, str(context / '_build' / 'scripts' / 'introspect.py'), 'introspect',
                           '--write-pip', str(out), str(tmp_path / 'coll')], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0 and out.is_file(), proc.stdout + proc.stderr + repr(os.listdir(str(tmp_path / 'coll')))
    wanted = {name: version.split('#')[0].strip() for name, version in pins(str(out)).items()}
    assert wanted == {'nvidia-ml-py': REQUIREMENTS['nvidia-ml-py'], 'gguf': REQUIREMENTS['gguf']}


def test_the_toolchain_runs_the_pinned_builder_and_runner():
    from importlib.metadata import version  # pylint: disable=import-outside-toplevel
    assert version('ansible-builder') == REQUIREMENTS['ansible-builder']
    assert version('ansible-runner') == REQUIREMENTS['ansible-runner']
