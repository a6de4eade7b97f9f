# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""python_library: the bounds and checks on a wheel sent to a node, and the pick of the copy to
import. The module end to end (unpack, import, refusals) is tests/unit/plugins/modules/test_gpu_facts.py."""

from __future__ import annotations

import base64
import io
import stat
import zipfile

import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.facts import python_library
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.python_library import (
    PythonLibraryError,
    find_unpacked,
    parse_wheel,
    unpack_wheel,
    version_key,
    wheel_distribution,
)

NAME = 'nvidia_ml_py-13.615.71-py3-none-any.whl'


def wheel_b64(members, links=()):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, 'w') as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        for member in links:
            info = zipfile.ZipInfo(member)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, '/etc/shadow')
    return base64.b64encode(buf.getvalue()).decode('ascii')


def test_distribution_names_and_versions():
    assert wheel_distribution('nvidia-ml-py') == 'nvidia_ml_py' == wheel_distribution('NVIDIA.ml_py')
    assert version_key('13.615.71') > version_key('13.615.9') > version_key('12.999')


def test_a_good_wheel_parses():
    stem, data = parse_wheel(NAME, wheel_b64({'pynvml.py': b'x = 1\n'}), 'nvidia-ml-py', 'pynvml')
    assert stem == 'nvidia_ml_py-13.615.71' and data[:2] == b'PK'


def test_a_symbolic_link_member_is_refused():
    with pytest.raises(PythonLibraryError, match="member 'evil.py' is a symbolic link"):
        parse_wheel(NAME, wheel_b64({'pynvml.py': b''}, links=['evil.py']), 'nvidia-ml-py', 'pynvml')


def test_size_and_member_bounds(monkeypatch):
    monkeypatch.setattr(python_library, 'WHEEL_MAX_BYTES', 1000)
    with pytest.raises(PythonLibraryError, match='library_wheel.content: more than 1000 bytes once decoded'):
        parse_wheel(NAME, 'A' * 2000, 'nvidia-ml-py', 'pynvml')
    monkeypatch.setattr(python_library, 'UNPACKED_MAX_BYTES', 100)
    with pytest.raises(PythonLibraryError, match='unpacks to more than 100 bytes'):
        parse_wheel(NAME, wheel_b64({'pynvml.py': b'#' * 101}), 'nvidia-ml-py', 'pynvml')
    monkeypatch.setattr(python_library, 'WHEEL_MAX_MEMBERS', 2)
    with pytest.raises(PythonLibraryError, match='the wheel has 3 members, more than 2'):
        parse_wheel(NAME, wheel_b64({'pynvml.py': b'', 'a.py': b'', 'b.py': b''}), 'nvidia-ml-py', 'pynvml')


def test_unpack_replaces_a_broken_copy_whole(tmp_path):
    broken = tmp_path / 'nvidia_ml_py-13.615.71'
    broken.mkdir()
    (broken / 'leftover.txt').write_text('half of an old copy')
    data = parse_wheel(NAME, wheel_b64({'pynvml.py': b'x = 1\n', 'sub/data.txt': b'd'}), 'nvidia-ml-py', 'pynvml')[1]
    final = unpack_wheel(data, str(tmp_path), 'nvidia_ml_py-13.615.71')
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob('*')) == [
        'nvidia_ml_py-13.615.71', 'nvidia_ml_py-13.615.71/pynvml.py',
        'nvidia_ml_py-13.615.71/sub', 'nvidia_ml_py-13.615.71/sub/data.txt']
    assert final == str(broken)


def test_find_unpacked_picks_the_newest_of_this_distribution(tmp_path):
    tmp_path.chmod(0o755)
    for name in ('nvidia_ml_py-12.0', 'nvidia_ml_py-13.615.71', 'nvidia_ml_py-13.615.9', 'other_dist-99.0',
                 '.nvidia_ml_py-99.0.tmp'):
        (tmp_path / name).mkdir(mode=0o755)
        (tmp_path / name / 'pynvml.py').write_text('')
    found, reason = find_unpacked(str(tmp_path), 'nvidia-ml-py', 'pynvml')
    assert reason is None and found == str(tmp_path / 'nvidia_ml_py-13.615.71' / 'pynvml.py')
    (tmp_path / 'nvidia_ml_py-13.615.71' / 'pynvml.py').unlink()
    found, reason = find_unpacked(str(tmp_path), 'nvidia-ml-py', 'pynvml')
    assert found is None and 'pynvml.py' in reason
