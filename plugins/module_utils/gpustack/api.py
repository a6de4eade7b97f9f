# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the collection and the serving watchdog both know about GPUStack's management API: its
generations (v1, v2, auto), the rule that tells them apart on a live server, the route of a
resource and the fields the server owns on a model record.

Standard library only, and nothing imported from the collection: this same file is shipped next
to the watchdog program on the GPU nodes (roles/serving_watchdog), where neither Ansible nor the
collection is installed. Each side keeps its own HTTP stack - the collection's GpustackClient
(module_utils/gpustack/client.py), the watchdog's raw requests - and hands detect_api_version
a ``status_of(path)`` callable that does one GET and returns its HTTP status.

The option lists Ansible reads as literal YAML (the doc fragment kvpin.fleet.gpustack, the
serving_watchdog role's argument_specs and its validate task, the kvpin_watchdog_targets filter's
and the gpustack modules' documentation) cannot import this file:
tests/unit/plugins/module_utils/test_gpustack_api.py checks each of them against it, and checks
that this file imports only the standard library.
"""

# GPUStack's management routes, read in its source:
#   0.7.x (0.7.1): under /v1 (gpustack/routes/routes.py: v1_admin_router with /models,
#          /model-instances, /workers, included with prefix="/v1" behind get_admin_user).
#          There is no /v2 route: GET /v2/models answers 404.
#   2.x (2.3.0): the same resources under /v2 (gpustack/routes/routes.py versioned_prefix = "/v2").
#   Both answer a list as PaginatedList {items, pagination} (schemas/common.py), paged with
#   ``page`` and ``perPage``.
# The auth dependency runs only on a route that matched: a route that exists answers 401/403 to
# a bad key, one that does not answers 404 whatever the key. So the status of one GET tells the
# generations apart, even without a valid key.
API_VERSIONS = ('v1', 'v2')
# The option value that asks the server (detect_api_version) instead of naming a generation.
API_VERSION_AUTO = 'auto'
API_VERSION_CHOICES = (API_VERSION_AUTO,) + API_VERSIONS
# The generations probed, in order: the newest first, so a server that served both would be
# spoken to in its newest API.
DETECTION_ORDER = ('v2', 'v1')
# The resource whose list is probed: it exists in every generation.
DETECTION_RESOURCE = 'models'
# The one status that says a route does not exist.
HTTP_NOT_FOUND = 404

# ModelInstance.state of an instance that serves (0.7.1 schemas/models.py ModelInstanceStateEnum
# RUNNING = "running"; the others are initializing, pending, starting, scheduled, error,
# downloading, analyzing and unreachable).
INSTANCE_STATES_RUNNING = ('running',)

# Server-owned status on a model read back from the API. They are not part of ModelUpdate
# (2.3.0 schemas/models.py: "the frontend has to strip it by hand"), so a full-record PUT
# leaves them out.
SERVER_OWNED_MODEL_FIELDS = (
    'id', 'created_at', 'updated_at', 'deleted_at', 'state', 'state_message', 'role_status',
    'stale', 'degradations', 'restarting_since', 'has_stale_lora_instances', 'ready_replicas',
)


class ApiVersionError(ValueError):
    """No GPUStack API generation to use: an unknown one was named, or none answered.
    ``probes`` is ((path, status), ...) of the GETs made, in order (empty when none was)."""

    def __init__(self, message, probes=()):
        super().__init__(message)
        self.probes = tuple(probes)


def check_api_version(version):
    """``version`` when it is one of API_VERSIONS (not ``auto``: a route needs a generation),
    else ApiVersionError."""
    if version not in API_VERSIONS:
        raise ApiVersionError('GPUStack API version must be one of %s, got %r' % (', '.join(API_VERSIONS), version))
    return version


def route(version, resource, resource_id=None):
    """The path of ``resource`` (``models``, ``model-instances``, ``workers/labels``, ...) in
    generation ``version``: ``/v2/models``, or ``/v1/model-instances/7`` with ``resource_id``."""
    base = '/%s/%s' % (check_api_version(version), resource)
    return base if resource_id is None else '%s/%s' % (base, resource_id)


def detection_path(version):
    """The path detect_api_version GETs for ``version`` (``/v2/models``, ``/v1/models``)."""
    return route(version, DETECTION_RESOURCE)


def detect_api_version(status_of):
    """The generation a server speaks: the first of DETECTION_ORDER whose detection_path answers
    anything but 404 (2xx, and 401/403 too: the route exists, the real call reports the auth
    error; a 5xx or a redirect also comes from a route that is there).

    ``status_of(path)`` does one GET of ``path`` and returns its HTTP status (an int). A GET that
    gets no answer at all (network, TLS, timeout) should raise: whatever it raises goes through
    as it is. Neither path there: ApiVersionError naming each path and its status."""
    probes = []
    for version in DETECTION_ORDER:
        path = detection_path(version)
        status = status_of(path)
        if isinstance(status, bool) or not isinstance(status, int):
            raise TypeError('status_of(%r) must return the HTTP status as an int, got %r' % (path, status))
        probes.append((path, status))
        if status != HTTP_NOT_FOUND:
            return version
    raise ApiVersionError('neither %s exists (%s): is this a GPUStack server?' % (
        ' nor '.join(path for path, _status in probes),
        ', '.join('GET %s answered HTTP %d' % probe for probe in probes)), probes)
