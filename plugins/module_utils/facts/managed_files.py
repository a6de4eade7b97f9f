# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A role's table of the files it manages -> the ``files`` of a kvpin.fleet.node_state check.

Each role keeps one table (vars/main.yml) of what it writes: path, owner, group, mode and, for
a file, the exact content. Its writing tasks take dest/mode/owner/group/content from the table,
and its desired state is this function of the same table, so "in sync" and "what a write
would leave" cannot disagree. The content never leaves: only its sha1 does (a content may hold
a token), and no error message quotes it.

A row also says what its file's life is (``LIFECYCLE_KEYS``): ``backup`` (keep the previous
version, restored by a rollback; a file this write created is removed by it), ``restart`` (the
handler a change of the file notifies, or none), ``verify_unit`` (a systemd unit checked with
systemd-analyze verify before anything is written) and ``validate`` (a command that checks the
new content first). kvpin.fleet.managed_files takes the whole row; ``lifecycle`` derives the
restart, rollback and cleanup lists from the same rows, so a new file is one row."""


import hashlib

# What a table entry may say: the node_state file fields, with ``content`` instead of ``sha1``,
# and the columns of the file's life (what a write does around it; not part of the state).
STATE_KEYS = ('path', 'state', 'content', 'mode', 'owner', 'group', 'entries')
LIFECYCLE_KEYS = ('backup', 'restart', 'verify_unit', 'validate')
ENTRY_KEYS = STATE_KEYS + LIFECYCLE_KEYS


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
    """node_state ``files`` entries for ``table`` (a list of entries, in order): every state key
    but ``content`` as given, ``content`` replaced by its ``sha1``; the lifecycle columns left out.

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
        check = dict((key, entry[key]) for key in entry if key != 'content' and key not in LIFECYCLE_KEYS)
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


def _rows(table):
    """(index, path, entry) of each row, the lifecycle columns checked (never the content)."""
    if not isinstance(table, (list, tuple)):
        raise ManagedFileError('expected a list of file entries, got %s' % type(table).__name__)
    rows = []
    for index, entry in enumerate(table):
        if not isinstance(entry, dict):
            raise ManagedFileError('%s: must be a dict, got %s' % (_where(index, entry), type(entry).__name__))
        path = entry.get('path')
        if not isinstance(path, str) or not path.startswith('/'):
            raise ManagedFileError('%s: path must be an absolute path, got %r' % (_where(index, entry), path))
        for key in ('backup', 'verify_unit'):
            if entry.get(key) is not None and not isinstance(entry.get(key), bool):
                raise ManagedFileError('%s: %s must be true or false, got %r' % (_where(index, entry), key, entry.get(key)))
        restart = entry.get('restart')
        if restart is not None and (not isinstance(restart, str) or not restart.strip()):
            raise ManagedFileError('%s: restart must be a handler name or none, got %r' % (_where(index, entry), restart))
        if (entry.get('backup') or entry.get('verify_unit')) and entry.get('state', 'file') != 'file':
            raise ManagedFileError('%s: backup and verify_unit only apply to state file, not %s'
                                   % (_where(index, entry), entry.get('state')))
        rows.append((index, path, entry))
    return rows


def _written_files(written):
    """{path: result} of a kvpin.fleet.managed_files result (empty when the write did not run)."""
    if written is None or written == {}:
        return {}, []
    if not isinstance(written, dict):
        raise ManagedFileError('written: expected the registered result of kvpin.fleet.managed_files, got %s'
                               % type(written).__name__)
    files = written.get('files') or []
    if not isinstance(files, (list, tuple)) or not all(isinstance(f, dict) and isinstance(f.get('path'), str)
                                                       for f in files):
        raise ManagedFileError('written: files must be a list of results with a path each')
    changed = written.get('changed_paths') or []
    if not isinstance(changed, (list, tuple)):
        raise ManagedFileError('written: changed_paths must be a list of paths')
    return dict((f['path'], f) for f in files), list(changed)


def lifecycle(table, written=None):
    """What a role does around the writes of its table, derived from the rows' lifecycle columns.

    Without ``written``: ``restart`` ({handler: [paths]}, each handler the rows name, the
    paths in table order), ``backup`` (paths whose previous version a rollback restores),
    ``verify_unit`` (unit files verified before the write).

    With ``written`` (the registered kvpin.fleet.managed_files result of writing the table;
    ``{}`` or None where it did not run) also what that write means: ``restart_needed`` (the
    handlers of the changed rows, in table order), ``restore`` ({backup, dest, owner, group, mode}
    of each backup row the write replaced, what a rollback copies back), ``created`` (backup rows
    the write created: a rollback removes them, there was nothing before) and ``backup_files``
    (the backups it made, dropped once the change is proved good or rolled back)."""
    rows = _rows(table)
    restart = {}
    for _unused, path, entry in rows:
        if entry.get('restart'):
            restart.setdefault(entry.get('restart'), []).append(path)
    result = dict(
        restart=restart,
        backup=[path for _unused, path, entry in rows if entry.get('backup')],
        verify_unit=[path for _unused, path, entry in rows if entry.get('verify_unit')],
    )
    by_path, changed = _written_files(written)
    restart_needed = []
    for _unused, path, entry in rows:
        handler = entry.get('restart')
        if handler and path in changed and handler not in restart_needed:
            restart_needed.append(handler)
    restore, created = [], []
    for _unused, path, entry in rows:
        outcome = by_path.get(path)
        if not entry.get('backup') or outcome is None:
            continue
        if outcome.get('backup_file'):
            restore.append({'backup': outcome['backup_file'], 'dest': path, 'owner': entry.get('owner'),
                            'group': entry.get('group'), 'mode': entry.get('mode')})
        if outcome.get('created'):
            created.append(path)
    result.update(restart_needed=restart_needed, restore=restore, created=created,
                  backup_files=[item['backup'] for item in restore])
    return result
