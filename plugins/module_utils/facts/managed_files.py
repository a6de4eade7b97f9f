# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's table of the files it manages -> the ``files`` of a kvpin.fleet.node_state check.

Each role keeps one table (vars/main.yml) of what it writes: path, owner, group, mode and, for
a file, the exact content. Its writing tasks take dest/mode/owner/group/content from the table,
and its desired state is this function of the same table, so "in sync" and "what a write
would leave" cannot disagree. The content never leaves: only its sha1 does (a content may hold
a token), and no error message quotes it."""

from __future__ import (absolute_import, division, print_function)
__metaclass__ = type

import hashlib

# What a table entry may say: the node_state file fields, with ``content`` instead of ``sha1``.
ENTRY_KEYS = ('path', 'state', 'content', 'mode', 'owner', 'group', 'entries')


class ManagedFileError(ValueError):
    """A table entry node_state could not check (named by its index and path)."""


def _where(index, entry):
    path = entry.get('path') if isinstance(entry, dict) else None
    return 'files[%d]%s' % (index, (' (%s)' % path) if isinstance(path, str) else '')


def content_sha1(content):
    """Hex sha1 of ``content`` as Ansible's copy module writes it (UTF-8; surrogate escapes
    back to their bytes, like ansible's to_bytes and the ``hash`` filter)."""
    return hashlib.sha1(content.encode('utf-8', 'surrogateescape')).hexdigest()


def file_checks(table, paths_only=False):
    """node_state ``files`` entries for ``table`` (a list of entries, in order): every key but
    ``content`` as given, ``content`` replaced by its ``sha1``.

    ``paths_only``: ``content`` becomes ``read_sha1: true`` and is never read, so a lazily
    templated table (ansible-core 2.19 hands filters lazy containers; 2.18 renders it first,
    with the same result) renders no template: what a probe needs to observe the files before
    the contents are known (site.yml's first pass)."""
    if not isinstance(table, (list, tuple)):
        raise ManagedFileError('expected a list of file entries, got %s' % type(table).__name__)
    checks = []
    seen = set()
    for index, entry in enumerate(table):
        if not isinstance(entry, dict):
            raise ManagedFileError('%s: must be a dict, got %s' % (_where(index, entry), type(entry).__name__))
        unknown = sorted(str(key) for key in entry if key not in ENTRY_KEYS)
        if unknown:
            raise ManagedFileError('%s: unknown key(s) %s (allowed: %s)'
                                   % (_where(index, entry), ', '.join(unknown), ', '.join(ENTRY_KEYS)))
        path = entry.get('path')
        if not isinstance(path, str) or not path.startswith('/'):
            raise ManagedFileError('%s: path must be an absolute path, got %r' % (_where(index, entry), path))
        if path in seen:
            raise ManagedFileError('%s: the table already has an entry for this path' % _where(index, entry))
        seen.add(path)
        # Key by key, never items(): reading the content value would render it.
        check = dict((key, entry[key]) for key in entry if key != 'content')
        if 'content' in entry:
            if entry.get('state', 'file') != 'file':
                raise ManagedFileError('%s: content only applies to state file, not %s'
                                       % (_where(index, entry), entry.get('state')))
            if paths_only:
                check['read_sha1'] = True
            else:
                content = entry['content']
                if not isinstance(content, str):
                    # The type only: the content itself may be a secret.
                    raise ManagedFileError('%s: content must be a string, got %s'
                                           % (_where(index, entry), type(content).__name__))
                check['sha1'] = content_sha1(content)
        checks.append(check)
    return checks
