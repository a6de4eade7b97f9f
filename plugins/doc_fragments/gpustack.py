# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


class ModuleDocFragment(object):
    """Connection options of the modules that talk to GPUStack's management API; their argument
    spec is gpustack_connection_argument_spec() in module_utils/gpustack/client.py. The api_version
    choices are module_utils/gpustack/api.py API_VERSION_CHOICES, written out because Ansible reads
    them as YAML (tests/unit/plugins/module_utils/test_gpustack_api.py checks that they agree)."""

    DOCUMENTATION = r'''
options:
  server_url:
    description:
      - Base URL of the GPUStack server, for example C(https://gpustack.example:443).
      - No credentials (C(user:password@)), query or fragment.
      - Defaults to the environment variable E(GPUSTACK_SERVER_URL).
    type: str
    required: true
  api_key:
    description:
      - GPUStack API key (C(gpustack_...)), sent as C(Authorization) C(Bearer). Needs the
        management scope.
      - Surrounding whitespace (the trailing newline of a C(|) vault scalar or of
        C(slurp | b64decode)) is stripped; a key with whitespace, control or non-ASCII characters
        inside is refused without being shown.
      - Sent only to the origin (scheme, host, port) of O(server_url); a redirect to another origin,
        or of any request but a GET, fails naming its C(Location).
      - Defaults to the environment variable E(GPUSTACK_API_KEY).
    type: str
    required: true
  validate_certs:
    description: Verify the server's TLS certificate.
    type: bool
    default: true
  ca_path:
    description:
      - PEM file of the CA that signed the server's certificate. A missing file, or one without a
        C(BEGIN CERTIFICATE) block, fails before anything is sent.
    type: path
  timeout:
    description:
      - Seconds one request may take in all (connect, TLS, headers, body and same-origin redirects),
        more than 0 and at most 3600. Answers are also capped in size (16 MiB).
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
