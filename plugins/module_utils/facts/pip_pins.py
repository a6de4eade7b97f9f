# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""pip requirements a node's install can be compared with without running pip.

An idempotence check compares versions exactly, so only two forms are accepted: an exact pin
(``name==version``: that version must be installed) and a bare name (installed, any version).
Ranges (``>=``), extras, markers and URLs would need pip's resolver to judge; a fleet pins
what it runs, so they are refused with the requirement named."""


import re

# PEP 508 names; versions as pip prints them (no spaces, no further operators).
_EXACT_PIN = re.compile(r'^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*))?\s*$')


class PipPinError(ValueError):
    """A requirement that is neither a bare name nor an exact pin."""


def pip_pins(requirements):
    """[{'name': ..., 'version': ... or None}] from requirement strings, in order."""
    pins = []
    for requirement in requirements or []:
        match = _EXACT_PIN.match(requirement) if isinstance(requirement, str) else None
        if match is None:
            raise PipPinError(
                'requirement %r is neither a bare name nor an exact pin (name==version): the '
                'rerun check compares installed versions exactly' % (requirement,))
        pins.append({'name': match.group(1), 'version': match.group(2)})
    return pins
