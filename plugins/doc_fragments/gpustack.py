# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type


class ModuleDocFragment(object):
    """Connection options of the modules that talk to GPUStack's management API; their argument
    spec is gpustack_connection_argument_spec() in module_utils/gpustack_client.py."""

    DOCUMENTATION = r'''
options:
  server_url:
    description:
      - Base URL of the GPUStack server, for example C(https://gpustack.example:443).
      - Defaults to the environment variable E(GPUSTACK_SERVER_URL).
    type: str
    required: true
  api_key:
    description:
      - GPUStack API key (C(gpustack_...)), sent as C(Authorization) C(Bearer). Needs the
        management scope.
      - Defaults to the environment variable E(GPUSTACK_API_KEY).
    type: str
    required: true
  validate_certs:
    description: Verify the server's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: PEM file of the CA that signed the server's certificate.
    type: path
  timeout:
    description: Seconds to wait for each answer.
    type: int
    default: 30
  api_version:
    description:
      - Management API generation. C(v2) for GPUStack 2.x, C(v1) for 0.7.x.
      - C(auto) asks the server - C(/v2/models) exists on 2.x only.
    type: str
    choices: [auto, v1, v2]
    default: auto
'''
