# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
name: wheel
author: kvpin.fleet contributors (!UNKNOWN)
version_added: "0.2.0"
short_description: A pure-Python wheel on the controller, as the library_wheel of kvpin.fleet.gpu_facts
description:
  - Reads a wheel file on the controller and returns its file name and its bytes as base64, the
    O(kvpin.fleet.gpu_facts#module:library_wheel) option's format. That module unpacks it on a node
    whose Python cannot import C(pynvml), in the same call that reads the GPUs.
  - The file must be a regular file named C(<distribution>-<version>-py3-none-any.whl), a zip
    archive, and at most 16 MiB; anything else fails naming the path and the reason.
options:
  _terms:
    description: Paths of wheel files on the controller.
    type: list
    elements: path
    required: true
'''

EXAMPLES = r'''
- name: Probe a node, sending nvidia-ml-py in case it lacks it
  kvpin.fleet.gpu_facts:
    library_wheel: "{{ lookup('kvpin.fleet.wheel', '/srv/wheelhouse/nvidia_ml_py-13.615.71-py3-none-any.whl') }}"
'''

RETURN = r'''
_raw:
  description: Per path, the wheel.
  type: list
  elements: dict
  contains:
    name:
      description: The wheel's file name.
      type: str
    content:
      description: The wheel's bytes, base64.
      type: str
'''

import base64
import io
import os
import stat
import zipfile

from ansible.errors import AnsibleLookupError
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.lookup import LookupBase

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.python_library import WHEEL_MAX_BYTES, WHEEL_NAME_RE


def read_wheel(path):
    """{name, content} of the wheel at ``path``, checked before a byte of it is sent."""
    name = os.path.basename(path)
    if not WHEEL_NAME_RE.match(name):
        raise AnsibleLookupError('kvpin.fleet.wheel: %s is not a pure-Python wheel file name '
                                 '(<distribution>-<version>-py3-none-any.whl)' % path)
    try:
        # O_NONBLOCK: a FIFO named like a wheel is refused below instead of blocking the open.
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0)), 'rb') as handle:
            st = os.fstat(handle.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise AnsibleLookupError('kvpin.fleet.wheel: %s is not a regular file' % path)
            if st.st_size > WHEEL_MAX_BYTES:
                raise AnsibleLookupError('kvpin.fleet.wheel: %s is %d bytes, more than %d'
                                         % (path, st.st_size, WHEEL_MAX_BYTES))
            data = handle.read(WHEEL_MAX_BYTES + 1)
    except OSError as exc:
        raise AnsibleLookupError('kvpin.fleet.wheel: cannot read %s: %s' % (path, to_native(exc.strerror or exc)))
    if len(data) > WHEEL_MAX_BYTES:
        raise AnsibleLookupError('kvpin.fleet.wheel: %s grew past %d bytes while read' % (path, WHEEL_MAX_BYTES))
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise AnsibleLookupError('kvpin.fleet.wheel: %s is not a wheel (not a zip archive)' % path)
    return {'name': name, 'content': base64.b64encode(data).decode('ascii')}


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        wheels = []
        for term in terms:
            if not isinstance(term, str) or not term:
                raise AnsibleLookupError('kvpin.fleet.wheel: each term must be a wheel path, got %r' % (term,))
            wheels.append(read_wheel(term))
        return wheels
