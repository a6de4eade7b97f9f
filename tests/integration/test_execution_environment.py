# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""site.yml the way AWX runs a job, against one lab node (KVPIN_LAB_PREFIX composes with CI's):
ansible-runner over a private data dir holding project/ (a playbook importing the installed
kvpin.fleet.site, as a user's AWX project does), inventory/ (the lab's), env/extravars and
env/envvars, with the GPUStack secrets injected as AWX's custom credential type in README.md
injects them (files in the private data dir, their paths in environment variables). First run,
then a rerun with changed=0; neither secret in stdout, job events or any artifact.

The collection comes from this checkout's Galaxy tarball installed into the private data dir
(what the execution environment carries); the execution environment image itself is built and
checked by test_the_execution_environment_image_carries_the_collection_and_runs_a_playbook
(scripts/ee.sh build, cached by a hash of its inputs). ansible-runner runs on the host, not in
the image: the lab's nodes are reached by the containers.podman connection, i.e. the host's
podman, which an execution environment does not have (AWX reaches nodes over SSH; the lab nodes
run no sshd) - docs/execution-environment.md."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

import lab_fleet
from lab_fleet import REPO_ROOT, VENV_BIN, recap

sys.path.insert(0, os.path.join(REPO_ROOT, 'tests'))
from fleet_inventory import lab_deployments, save_layout_facts  # noqa: E402  pylint: disable=wrong-import-position

NODE = 'lab-4090x2'
# The lab's podman settings (docs/lab.md) and no network: everything the job needs is in the image.
PODMAN_OPTIONS = ['--runtime=runc', '--ulimit=nofile=20000:20000', '--ulimit=nproc=20000:20000', '--network=none']


def prefix():
    return os.environ.get('KVPIN_LAB_PREFIX', '')


@pytest.fixture(scope='module')
def one_node(fleet):  # pylint: disable=unused-argument
    """NODE of the session's lab fleet (tests/integration/conftest.py); the job is limited to it."""
    return NODE


@pytest.fixture(scope='module')
def private_data_dir(tmp_path_factory, one_node):
    """The job's private data dir, laid out as AWX gives it to ansible-runner."""
    pd = tmp_path_factory.mktemp('awx_job')
    ee = subprocess.run(['bash', os.path.join(REPO_ROOT, 'scripts', 'ee.sh'), 'inputs'], capture_output=True,
                        text=True, timeout=900, check=False)
    assert ee.returncode == 0, ee.stderr
    install = subprocess.run([os.path.join(VENV_BIN, 'ansible-galaxy'), 'collection', 'install', '--force', '-p',
                              str(pd / 'collections'), os.path.join(REPO_ROOT, 'ee', 'build', 'kvpin-fleet.tar.gz')],
                             capture_output=True, text=True, timeout=300, check=False, cwd=str(pd))
    assert install.returncode == 0, install.stdout + install.stderr
    (pd / 'project').mkdir()
    (pd / 'project' / 'site.yml').write_text('---\n- name: Roll out kvpin.fleet\n'
                                             '  ansible.builtin.import_playbook: kvpin.fleet.site\n')
    shutil.copytree(os.path.join(REPO_ROOT, 'inventory', 'lab'), str(pd / 'inventory'))
    (pd / 'env').mkdir(mode=0o700)
    # The credential's injector: each secret in a 0600 file of the private data dir, its path in
    # the environment (README "GPUStack token as a custom credential type").
    lab_dir = os.path.join(REPO_ROOT, '.lab')
    secrets = {}
    for name, source in (('gpustack_api_key', 'api_key'), ('gpustack_worker_token', 'token')):
        with open(os.path.join(lab_dir, prefix() + 'gpustack', source), encoding='utf-8') as handle:
            secrets[name] = handle.read().strip()
        path = pd / 'env' / name
        path.write_text(secrets[name])
        path.chmod(0o600)
    with open(os.path.join(lab_dir, prefix() + 'gpustack', 'server_url'), encoding='utf-8') as handle:
        server_url = handle.read().strip()
    envvars = {'GPUSTACK_SERVER_URL': server_url,
               'GPUSTACK_API_KEY_FILE': str(pd / 'env' / 'gpustack_api_key'),
               'GPUSTACK_WORKER_TOKEN_FILE': str(pd / 'env' / 'gpustack_worker_token'),
               'KVPIN_LAB_PREFIX': prefix(), 'KVPIN_LAB_DIR': lab_dir,
               'ANSIBLE_COLLECTIONS_PATH': str(pd / 'collections'), 'ANSIBLE_NOCOLOR': '1',
               'PATH': VENV_BIN + os.pathsep + os.environ.get('PATH', '')}
    (pd / 'env' / 'envvars').write_text(yaml.safe_dump(envvars))
    # The job template's extra vars: the secrets read from the injected files, never written here.
    extravars = {'gpustack_server_url': "{{ lookup('ansible.builtin.env', 'GPUSTACK_SERVER_URL') }}",
                 'gpustack_api_key': "{{ lookup('ansible.builtin.file', lookup('ansible.builtin.env', "
                                     "'GPUSTACK_API_KEY_FILE')) }}",
                 'gpustack_worker_token': "{{ lookup('ansible.builtin.file', lookup('ansible.builtin.env', "
                                          "'GPUSTACK_WORKER_TOKEN_FILE')) }}",
                 'kvpin_wheelhouse_dir': os.path.join(REPO_ROOT, '.cache', 'wheelhouse')}
    (pd / 'env' / 'extravars').write_text(yaml.safe_dump(extravars))
    return pd, secrets


def runner(pd, ident):
    proc = subprocess.run([os.path.join(VENV_BIN, 'ansible-runner'), 'run', str(pd), '-p', 'site.yml',
                           '--limit', NODE, '--ident', ident],
                          capture_output=True, text=True, timeout=900, check=False,
                          env=dict(lab_fleet.ansible_env(), ANSIBLE_NOCOLOR='1'))
    return proc


def test_site_yml_through_ansible_runner_reruns_unchanged_and_leaks_no_secret(private_data_dir):
    pd, secrets = private_data_dir
    first = runner(pd, 'first')
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    assert recap(first.stdout)[NODE]['failed'] == 0
    rerun = runner(pd, 'rerun')
    assert rerun.returncode == 0, rerun.stdout[-6000:] + rerun.stderr
    assert recap(rerun.stdout)[NODE] == {'ok': recap(rerun.stdout)[NODE]['ok'], 'changed': 0, 'unreachable': 0,
                                         'failed': 0}
    # The job's status as AWX reads it, and the rerun's changed=0 in the final stats event.
    with open(str(pd / 'artifacts' / 'rerun' / 'status'), encoding='utf-8') as handle:
        assert handle.read().strip() == 'successful'
    stats = [json.loads(p.read_text()) for p in (pd / 'artifacts' / 'rerun' / 'job_events').glob('*.json')]
    final = [e for e in stats if e.get('event') == 'playbook_on_stats']
    assert final and final[0]['event_data']['changed'] == {}
    # No secret anywhere ansible-runner wrote or printed: stdout, events, command (its env).
    written = first.stdout + first.stderr + rerun.stdout + rerun.stderr
    for path in (pd / 'artifacts').rglob('*'):
        if path.is_file():
            written += path.read_text(errors='replace')
    for name, secret in secrets.items():
        assert len(secret) >= 16, name
        assert secret not in written, '%s leaked into the runner output or artifacts' % name


def test_the_execution_environment_image_carries_the_collection_and_runs_a_playbook(tmp_path):
    """scripts/ee.sh build (podman, no network; reused when the inputs' hash is unchanged), then:
    inside the image, with no network, ansible-core at the pin, the collection, pynvml and gguf;
    and ansible-runner running a job in the image (--process-isolation --container-image):
    plan.yml over two nodes planned offline from saved gpu_facts output."""
    lab_fleet.require_lab()
    build = subprocess.run(['bash', os.path.join(REPO_ROOT, 'scripts', 'ee.sh'), 'build'], capture_output=True,
                           text=True, timeout=1800, check=False)
    assert build.returncode == 0, build.stderr[-6000:]
    image = build.stdout.strip().splitlines()[-1]
    with open(os.path.join(REPO_ROOT, 'requirements.txt'), encoding='utf-8') as handle:
        core = [line.split('==')[1].strip() for line in handle if line.startswith('ansible-core==')][0]
    script = ('set -e; ansible --version | head -n1; ansible-galaxy collection list kvpin.fleet; '
              'python3 -c "import pynvml, gguf; print(\'libs ok\')"')
    proc = subprocess.run(['podman', 'run', '--rm'] + PODMAN_OPTIONS + [image, 'bash', '-c', script],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert 'ansible [core %s]' % core in proc.stdout
    assert 'kvpin.fleet 0.' in proc.stdout and 'libs ok' in proc.stdout

    # A job in the image: the private data dir is mounted at /runner.
    pd = tmp_path / 'pd'
    saved = save_layout_facts(tmp_path, str(pd / 'saved'))
    (pd / 'project').mkdir(parents=True)
    (pd / 'project' / 'plan.yml').write_text('---\n- name: Plan the fleet\n'
                                             '  ansible.builtin.import_playbook: kvpin.fleet.plan\n')
    hosts = {'node-%d' % i: {'kvpin_gpu_facts_file': '/runner/saved/%s' % os.path.basename(saved[layout]),
                             'kvpin_deployments': lab_deployments(layout), 'gpustack_worker_runtime': 'native'}
             for i, layout in enumerate(('lab-4090x2', 'lab-mixed'))}
    (pd / 'inventory').mkdir()
    (pd / 'inventory' / 'hosts.yml').write_text(yaml.safe_dump({'all': {'children': {'gpu_nodes': {
        'vars': {'ansible_connection': 'ssh', 'ansible_host': '127.0.0.1', 'ansible_port': 9}, 'hosts': hosts}}}}))
    (pd / 'env').mkdir()
    (pd / 'env' / 'extravars').write_text('kvpin_plan_report_path: /runner/artifacts/plan.html\n')
    (pd / 'env' / 'envvars').write_text('ANSIBLE_NOCOLOR: "1"\n')
    job = subprocess.run([os.path.join(VENV_BIN, 'ansible-runner'), 'run', str(pd), '-p', 'plan.yml', '--ident', 'ee',
                          '--process-isolation', '--process-isolation-executable', 'podman', '--container-image', image]
                         + ['--container-option=%s' % option for option in PODMAN_OPTIONS + ['--user=0']],
                         capture_output=True, text=True, timeout=600, check=False)
    assert job.returncode == 0, job.stdout[-6000:] + job.stderr
    assert (pd / 'artifacts' / 'ee' / 'status').read_text().strip() == 'successful'
    counts = recap(job.stdout)
    assert {host: counts[host]['failed'] + counts[host]['unreachable'] for host in hosts} == {'node-0': 0, 'node-1': 0}
    report = (pd / 'artifacts' / 'plan.html').read_text()
    assert report.count('data-gpu="node-0:') == 2 and report.count('data-gpu="node-1:') == 2
