# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""kvpin.fleet.wheel: a wheel on the controller as gpu_facts' library_wheel, checked before it is sent."""

from __future__ import annotations

import base64
import os
import zipfile

import pytest
from ansible.errors import AnsibleLookupError

from ansible_collections.kvpin.fleet.plugins.lookup import wheel as wheel_lookup
from ansible_collections.kvpin.fleet.plugins.lookup.wheel import LookupModule

NAME = 'nvidia_ml_py-13.615.71-py3-none-any.whl'


def make_wheel(path):
    with zipfile.ZipFile(path, 'w') as archive:
        archive.writestr('pynvml.py', b'x = 1\n')
    return path


def test_a_wheel_comes_back_as_its_name_and_base64_bytes(tmp_path):
    path = make_wheel(tmp_path / NAME)
    [wheel] = LookupModule().run([str(path)], variables={})
    assert wheel == {'name': NAME, 'content': base64.b64encode(path.read_bytes()).decode('ascii')}


def test_bad_wheels_are_refused_naming_the_path(tmp_path, monkeypatch):
    not_zip = tmp_path / NAME
    not_zip.write_bytes(b'not a zip')
    (tmp_path / 'dir-1.0-py3-none-any.whl').mkdir()
    fifo = tmp_path / 'fifo-1.0-py3-none-any.whl'
    os.mkfifo(fifo)
    platform = make_wheel(tmp_path / 'nvidia_ml_py-1.0-cp311-cp311-linux_x86_64.whl')
    cases = [
        (str(not_zip), 'is not a wheel (not a zip archive)'),
        (str(tmp_path / 'dir-1.0-py3-none-any.whl'), 'Is a directory'),
        (str(fifo), 'is not a regular file'),
        (str(tmp_path / 'missing-1.0-py3-none-any.whl'), 'cannot read'),
        (str(platform), 'is not a pure-Python wheel file name'),
        ('', 'each term must be a wheel path'),
    ]
    for term, problem in cases:
        with pytest.raises(AnsibleLookupError) as caught:
            LookupModule().run([term], variables={})
        assert problem in str(caught.value) and (term in str(caught.value) or not term)
    big = make_wheel(tmp_path / 'big-1.0-py3-none-any.whl')
    monkeypatch.setattr(wheel_lookup, 'WHEEL_MAX_BYTES', 10)
    with pytest.raises(AnsibleLookupError, match=r'big-1.0-py3-none-any.whl is \d+ bytes, more than 10'):
        LookupModule().run([str(big)], variables={})
