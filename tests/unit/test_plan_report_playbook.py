# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/plan.yml writes the HTML plan report on the controller: the real playbook, run
with ansible-playbook on localhost as a one-node gpu_nodes group whose NVML is the stub (a lab
fixture's four RTX A6000, found through LD_LIBRARY_PATH as libnvidia-ml.so.1)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import yaml
from local_playbook import PLAYBOOK, REPO_ROOT, collections_root
from nvml_stub_pynvml import stub_library_path
from plan_report_nodes import FAKE_API_KEY, XSS

PLAN_YML = os.path.join(REPO_ROOT, 'playbooks', 'plan.yml')
FIXTURE = os.path.join(REPO_ROOT, 'tests', 'fixtures', 'nvml', 'lab-a6000x4.json')


def deployment(name, gpu_indexes, model='meta-llama/Llama-3.1-8B-Instruct', **engine):
    return {'name': name, 'backend': 'vllm', 'backend_version': '0.10.1.1', 'model': model,
            'gpu_indexes': gpu_indexes, 'engine': engine,
            'traffic': {'prompt_tokens_p99': 4096, 'max_output_tokens': 512, 'max_concurrency': 8}}


def run_plan_yml(work, *options):
    inventory = {'all': {'children': {'gpu_nodes': {'hosts': {'localhost': {
        'ansible_connection': 'local', 'ansible_python_interpreter': sys.executable,
        'gpustack_worker_runtime': 'native',
        'gpustack_api_key': FAKE_API_KEY,       # a secret in the inventory: it must not reach the page
        'kvpin_deployments': [deployment('chat', [0], gpu_memory_utilization=0.42),
                              deployment(XSS, [1], gpu_memory_utilization=0.5),
                              deployment('big', [2], model='llama-3.1-70b')]}}}}}}
    (work / 'inventory.yml').write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO_ROOT, 'ansible.cfg'),
               ANSIBLE_COLLECTIONS_PATH=collections_root(), HOME=str(work), ANSIBLE_NOCOLOR='1',
               ANSIBLE_LOCAL_TEMP=str(work / 'local_tmp'), ANSIBLE_REMOTE_TMP=str(work / 'remote_tmp'),
               ANSIBLE_RETRY_FILES_ENABLED='0', KVPIN_NVML_STUB_CONFIG=FIXTURE,
               LD_LIBRARY_PATH=os.path.dirname(stub_library_path()), PWD=str(work))
    return subprocess.run([PLAYBOOK, '-i', str(work / 'inventory.yml'), PLAN_YML] + list(options), env=env,
                          cwd=str(work), capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope='module')
def default_run(tmp_path_factory):
    work = tmp_path_factory.mktemp('plan_report')
    return work, run_plan_yml(work)


def test_plan_yml_writes_the_report_0644_in_the_directory_it_runs_in(default_run):
    work, proc = default_run
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    report = work / 'kvpin-plan-report.html'
    assert stat.S_IMODE(report.stat().st_mode) == 0o644
    text = report.read_text(encoding='utf-8')
    for index in range(4):
        assert text.count('data-gpu="localhost:%d"' % index) == 1
    assert 'FEASIBLE' in text and '<details open class="deployment infeasible">' in text and '<b>big</b>' in text
    assert XSS not in text and '&lt;script&gt;window.kvpinPwned=1' in text
    assert FAKE_API_KEY not in text


def test_plan_yml_writes_where_kvpin_plan_report_path_says_and_none_when_it_is_empty(tmp_path):
    target = tmp_path / 'out' / 'fleet.html'
    target.parent.mkdir()
    proc = run_plan_yml(tmp_path, '-e', 'kvpin_plan_report_path=%s' % target)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert target.is_file() and not (tmp_path / 'kvpin-plan-report.html').exists()
    proc = run_plan_yml(tmp_path, '-e', 'kvpin_plan_report_path=')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / 'kvpin-plan-report.html').exists()
