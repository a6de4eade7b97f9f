#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: managed_files
short_description: Converge a role's whole table of managed directories and files in one round trip
version_added: "0.2.0"
description:
  - Writes every entry of a role's table of managed files (the same table
    M(kvpin.fleet.node_state) checks) in order, in one module call - directories first as they
    come, then each file atomically (a temporary file in the same directory, validated when asked,
    then renamed over the old one) - and sets owner, group and mode.
  - Returns per path whether it changed, whether it was created and the backup it made, so the
    caller can notify handlers only for the paths that matter and restore the backups on a failed
    health check.
  - Never returns or logs a file's content (the content option is C(no_log)); an error names the
    entry's index and path, never its content.
  - Creates the system groups and users the table's owners need (O(groups), O(users)) first, in
    the same call, the way M(ansible.builtin.group) and M(ansible.builtin.user) with C(system)
    do. A missing one is created with C(groupadd)/C(useradd), an existing user whose primary
    group, shell or home differ is corrected with C(usermod) (its home is never created or
    moved), and an existing group is left as it is.
  - In check mode nothing is written; the result says what would change.
options:
  groups:
    description: System groups to create when missing, before anything else.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The group's name (letters, digits, C(_), C(-); up to 32 characters).
        type: str
        required: true
  users:
    description:
      - System users to create when missing or correct when they differ, after O(groups) and
        before O(files) (whose owners they may be).
      - An existing account with uid 0 is never changed (the module fails naming what would
        change), so a watchdog's shell and home never become root's.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The user's name (letters, digits, C(_), C(-); up to 32 characters).
        type: str
        required: true
      group:
        description: Its primary group, by name; must exist or be in O(groups).
        type: str
        required: true
      shell:
        description: Its login shell, an absolute path.
        type: str
        default: /usr/sbin/nologin
      home:
        description: Its home directory, an absolute path (never created).
        type: str
        default: /nonexistent
  files:
    description: The table, in order (a directory before the files in it).
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Absolute path.
        type: str
        required: true
      state:
        description: C(file), C(directory) or C(absent) (a file or an empty directory removed).
        type: str
        choices: [file, directory, absent]
        default: file
      content:
        description: The file's exact content (only with O(files[].state=file); required there).
        type: str
      owner:
        description: Owner, a user name.
        type: str
      group:
        description: Group, a group name.
        type: str
      mode:
        description: Permission bits, an octal string such as C("0600").
        type: raw
      backup:
        description: Keep a timestamped copy of a file this call replaces (same mode as the file).
        type: bool
        default: false
      entries:
        description:
          - Not used here - accepted so a role passes the same table to
            M(kvpin.fleet.node_state), which checks a directory's entries.
        type: list
        elements: str
      restart:
        description:
          - Not used here - accepted so a role passes its whole table, whose rows name the handler
            a change of the file notifies (P(kvpin.fleet.kvpin_managed_lifecycle#filter) derives the
            restarts from them and from this module's C(changed_paths)).
        type: str
      validate:
        description:
          - Command run on the new content before it replaces the file, C(%s) standing for the
            temporary file's path (as M(ansible.builtin.copy) does). A non-zero exit fails the
            module and leaves the old file in place.
        type: str
      verify_unit:
        description:
          - The entry is a systemd unit. When its content differs from the file on the node, the
            new content is checked with C(systemd-analyze verify) before anything in the table is
            written, under the unit's own file name in a private temporary directory (verify
            needs the suffix, so O(files[].validate) cannot do it). An output line naming the
            unit fails the module, quoting those lines, and nothing is written; lines about
            other units do not count.
          - Not run in check mode, where an install that would bring the unit's program has not
            run.
        type: bool
        default: false
  verify_timeout:
    description:
      - Seconds one O(files[].verify_unit) check may take (through C(timeout) from coreutils);
        one that takes longer fails the call with nothing written. 1 to 3600.
    type: int
    default: 120
  executables:
    description:
      - Programs the table's units will run, such as a native worker's C(ExecStart). Each must be
        an executable regular file (a symbolic link to one counts) before anything is written;
        otherwise the module fails naming it and writes nothing, in the same call.
      - Not checked in check mode, where an install that would bring the program has not run.
    type: list
    elements: path
    default: []
author:
  - kvpin.fleet contributors (!UNKNOWN)
notes:
  - Accounts are created before any file is written; when one cannot be, nothing in O(files) is
    written.
  - Files already written by this call stay written when a later entry fails; the result of a
    failure lists them (C(files)) so a rollback can use their backups.
'''

EXAMPLES = r'''
- name: Configure | the watchdog's account, program and config
  kvpin.fleet.managed_files:
    groups:
      - {name: kvpin-watchdog}
    users:
      - {name: kvpin-watchdog, group: kvpin-watchdog}
    files:
      - {path: /etc/kvpin, state: directory, owner: root, group: kvpin-watchdog, mode: "0750"}
  no_log: true

- name: Configure | the worker's directories, config, environment and unit
  kvpin.fleet.managed_files:
    files:
      - {path: /var/lib/gpustack, state: directory, owner: root, group: root, mode: "0750"}
      - {path: /var/lib/gpustack/config.yaml, content: "{{ config }}", owner: root, group: root,
         mode: "0600", backup: true}
  no_log: true
  register: written
'''

RETURN = r'''
accounts:
  description: One result per group, then per user, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: The account's name.
      type: str
    kind:
      description: C(group) or C(user).
      type: str
    changed:
      description: Whether it was created or corrected (or would be, in check mode).
      type: bool
    created:
      description: Whether it did not exist before.
      type: bool
    corrected:
      description: What differed on an existing user (C(group), C(shell), C(home)).
      type: list
      elements: str
changed:
  description: Whether any account or entry changed.
  returned: always
  type: bool
changed_paths:
  description: The paths that changed (or would, in check mode), in table order.
  returned: always
  type: list
  elements: str
  sample: [/var/lib/gpustack/config.yaml]
files:
  description: One result per entry, in table order (no content).
  returned: always
  type: list
  elements: dict
  contains:
    path:
      description: The entry's path.
      type: str
    changed:
      description: Whether the entry changed (or would).
      type: bool
    created:
      description: Whether the path did not exist before.
      type: bool
    backup_file:
      description: The backup of the replaced file, empty when none was made.
      type: str
'''

import grp
import os
import pwd
import re
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_native

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.managed_files import content_sha1
from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    USER_ATTRIBUTES, NotHashed, observe_user, sha1_of_file)


class EntryError(Exception):
    """An entry that could not be converged (the message names index and path, never content)."""


def _where(index, path):
    return 'files[%d] (%s)' % (index, path)


def _file_args(module, entry):
    mode = entry.get('mode')
    return module.load_file_common_arguments({'path': entry['path'], 'owner': entry.get('owner'),
                                              'group': entry.get('group'),
                                              'mode': None if mode is None else str(mode)})


def converge_directory(module, index, entry):
    path = entry['path']
    result = {'path': path, 'changed': False, 'created': False, 'backup_file': ''}
    if os.path.lexists(path) and not os.path.isdir(path):
        raise EntryError('%s: exists and is not a directory' % _where(index, path))
    if not os.path.isdir(path):
        result['changed'] = result['created'] = True
        if module.check_mode:
            return result
        os.makedirs(path)
    result['changed'] = module.set_fs_attributes_if_different(_file_args(module, entry), result['changed'])
    return result


def converge_absent(module, index, entry):
    path = entry['path']
    result = {'path': path, 'changed': os.path.lexists(path), 'created': False, 'backup_file': ''}
    if result['changed'] and not module.check_mode:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        except OSError as exc:
            raise EntryError('%s: cannot remove: %s' % (_where(index, path), to_native(exc.strerror or exc)))
    return result


def _validate(module, index, path, command, tmp_path):
    if '%s' not in command:
        raise EntryError('%s: validate must contain %%s, got %r' % (_where(index, path), command))
    rc, dummy_out, err = module.run_command(command % tmp_path)
    if rc != 0:
        # stderr of the validator, not the content (the validator must not print secrets either).
        raise EntryError('%s: validate failed (rc=%d): %s' % (_where(index, path), rc, to_native(err).strip()[-500:]))


def _content_differs(entry):
    """Whether the file at the entry's path is missing, not a regular file, or holds other content:
    what converge_file writes, and what verify_unit checks first."""
    path = entry['path']
    if not os.path.isfile(path) or os.path.islink(path):
        return True
    content = entry['content'].encode('utf-8', 'surrogateescape')   # as content_sha1 hashes it
    if os.path.getsize(path) != len(content):
        return True         # other content, known without reading a byte of it
    try:
        # opened without following a link or blocking on a FIFO swapped in; bounded
        return sha1_of_file(path) != content_sha1(entry['content'])
    except (OSError, NotHashed):
        return True


def converge_file(module, index, entry):
    path = entry['path']
    content = entry.get('content')
    if content is None:
        raise EntryError('%s: state file needs content' % _where(index, path))
    if os.path.lexists(path) and (os.path.islink(path) or not os.path.isfile(path)):
        raise EntryError('%s: exists and is not a regular file' % _where(index, path))
    exists = os.path.exists(path)
    result = {'path': path, 'changed': False, 'created': not exists, 'backup_file': ''}
    same = exists and not _content_differs(entry)
    if not same:
        result['changed'] = True
        if module.check_mode:
            return result
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            raise EntryError('%s: directory %s does not exist' % (_where(index, path), directory))
        handle, tmp_path = tempfile.mkstemp(prefix='.kvpin-', dir=directory)
        try:
            # 0600 until the final mode is set: a secret is never readable by others, not even briefly.
            os.fchmod(handle, 0o600)
            with os.fdopen(handle, 'wb') as out:
                out.write(to_bytes(content, errors='surrogate_or_strict'))
            if entry.get('validate'):
                _validate(module, index, path, entry['validate'], tmp_path)
            if exists and entry.get('backup'):
                result['backup_file'] = module.backup_local(path)
            # Owner, group and mode on the new file before it takes the path: the rename is the
            # only moment it becomes visible, already with its final mode.
            module.set_fs_attributes_if_different(dict(_file_args(module, entry), path=tmp_path), True)
            os.rename(tmp_path, path)
        finally:
            if os.path.exists(tmp_path):
                os.unlink(tmp_path)
    result['changed'] = module.set_fs_attributes_if_different(_file_args(module, entry), result['changed'])
    return result


# What useradd/groupadd accept on every distribution we run on (no leading digit or dash,
# no dots or uppercase, which some accept and others refuse), and their length limit.
ACCOUNT_NAME = re.compile(r'^[a-z_][a-z0-9_-]{0,31}$')
# A shell or home: absolute, printable, no separator useradd's files use.
ACCOUNT_PATH = re.compile(r'^/[^:\s\x00-\x1f\x7f]{0,255}$')


def account_problems(groups, users):
    """Why the O(groups)/O(users) lists cannot be applied as given (field names, values): empty
    when they can. Checked before anything is changed."""
    problems = []
    for index, group in enumerate(groups):
        if not ACCOUNT_NAME.match(group['name']):
            problems.append('groups[%d].name: %r is not a valid group name (a-z, 0-9, _, -; up to 32, '
                            'not starting with a digit or -)' % (index, group['name']))
    for index, user in enumerate(users):
        for field in ('name', 'group'):
            if not ACCOUNT_NAME.match(user[field]):
                problems.append('users[%d].%s: %r is not a valid %s name (a-z, 0-9, _, -; up to 32, '
                                'not starting with a digit or -)' % (index, field, user[field],
                                                                     'user' if field == 'name' else 'group'))
        for field in ('shell', 'home'):
            if not ACCOUNT_PATH.match(user[field]):
                problems.append('users[%d].%s: %r is not an absolute path without spaces, colons or control '
                                'characters' % (index, field, user[field]))
    return problems


def _group_gid(name):
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


USERMOD_FLAGS = {'group': '-g', 'shell': '-s', 'home': '-d'}


def user_corrections(entry, seen):
    """The fields of an existing user that differ from ``entry``: [(field, usermod flag, value)].
    ``seen`` is node_state's observe_user() answer, so what is corrected here is what the rerun's
    check calls drift."""
    return [(key, USERMOD_FLAGS[key], entry[key]) for key in USER_ATTRIBUTES if seen.get(key) != entry[key]]


def _run_account_command(module, where, argv):
    rc, dummy_out, err = module.run_command(argv)
    if rc != 0:
        raise EntryError('%s: %s failed (rc=%d): %s' % (where, os.path.basename(argv[0]), rc, to_native(err).strip()[-500:]))


def converge_accounts(module, groups, users, results):
    """Create missing groups, then create or correct users, appending one result per account to
    ``results`` (so a failure still reports the accounts already created)."""
    to_create = set()
    for index, group in enumerate(groups):
        name = group['name']
        created = _group_gid(name) is None
        results.append({'name': name, 'kind': 'group', 'changed': created, 'created': created, 'corrected': []})
        if created:
            to_create.add(name)
            if not module.check_mode:
                _run_account_command(module, 'groups[%d] (%s)' % (index, name),
                                     [module.get_bin_path('groupadd', required=True), '--system', name])
    for index, user in enumerate(users):
        name = user['name']
        where = 'users[%d] (%s)' % (index, name)
        if _group_gid(user['group']) is None and not (module.check_mode and user['group'] in to_create):
            raise EntryError('%s: group %s does not exist (add it to groups)' % (where, user['group']))
        seen = observe_user(name)
        if seen is None:
            results.append({'name': name, 'kind': 'user', 'changed': True, 'created': True, 'corrected': []})
            if not module.check_mode:
                _run_account_command(module, where, [
                    module.get_bin_path('useradd', required=True), '--system', '--gid', user['group'],
                    '--shell', user['shell'], '--home-dir', user['home'], '--no-create-home', name])
            continue
        corrections = user_corrections(user, seen)
        if corrections and pwd.getpwnam(name).pw_uid == 0:
            raise EntryError('%s: uid 0; refusing to change its %s (to %s): use a dedicated account'
                             % (where, ', '.join(field for field, dummy, dummy2 in corrections),
                                ', '.join(value for dummy, dummy2, value in corrections)))
        results.append({'name': name, 'kind': 'user', 'changed': bool(corrections), 'created': False,
                        'corrected': [field for field, dummy, dummy2 in corrections]})
        if corrections and not module.check_mode:
            argv = [module.get_bin_path('usermod', required=True)]
            for dummy, flag, value in corrections:
                argv.extend([flag, value])
            _run_account_command(module, where, argv + [name])


CONVERGE = {'directory': converge_directory, 'file': converge_file, 'absent': converge_absent}

# Bounds what a unit's complaints add to a message.
VERIFY_MESSAGE_MAX_CHARS = 1000
VERIFY_TIMEOUT_RANGE = (1, 3600)
# What coreutils' timeout exits with when the command ran out of time.
TIMEOUT_EXPIRED_RC = 124


def unit_complaints(output, unit_name):
    """The lines of systemd-analyze verify's output about ``unit_name`` (it also reports on
    other units it loads, which are not this change's problem)."""
    return [line.strip() for line in output.splitlines() if unit_name in line]


def verify_unit_problems(module, entries):
    """systemd-analyze verify of each changing unit's new content, before anything is written:
    a list of problems, one per unit with complaints."""
    pending = [(index, entry) for index, entry in enumerate(entries)
               if entry.get('verify_unit') and entry['state'] == 'file' and entry.get('content') is not None
               and entry['path'].startswith('/') and _content_differs(entry)]
    if not pending:
        return []
    analyze = module.get_bin_path('systemd-analyze', required=True)
    timeout = module.get_bin_path('timeout', required=True)
    problems = []
    scratch = tempfile.mkdtemp(prefix='kvpin-verify-')  # 0700: the content is nobody else's to read
    try:
        for index, entry in pending:
            unit_name = os.path.basename(entry['path'])
            candidate = os.path.join(scratch, unit_name)
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, 'wb') as handle:
                handle.write(to_bytes(entry['content'], errors='surrogate_or_strict'))
            rc, out, err = module.run_command([timeout, str(module.params['verify_timeout']), analyze, 'verify', candidate])
            os.unlink(candidate)
            if rc == TIMEOUT_EXPIRED_RC:
                problems.append('%s: systemd-analyze verify did not finish in %d s (verify_timeout)'
                                % (_where(index, entry['path']), module.params['verify_timeout']))
                continue
            complaints = unit_complaints(to_native(out) + '\n' + to_native(err), unit_name)
            if complaints:
                text = ' | '.join(line.replace(scratch + os.sep, '') for line in complaints)
                where = _where(index, entry['path'])
                problems.append('%s: systemd-analyze verify: %s' % (where, text[:VERIFY_MESSAGE_MAX_CHARS]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return problems


def executable_problem(path):
    """Why ``path`` cannot be run (None when it can): missing, not a regular file, not executable."""
    if not os.path.isabs(path):
        return '%s is not an absolute path' % path
    if not os.path.exists(path):
        return '%s is missing' % path
    if not os.path.isfile(path):
        return '%s is not a regular file' % path
    if not os.access(path, os.X_OK):
        return '%s is not executable' % path
    return None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            groups=dict(type='list', elements='dict', default=[], options=dict(
                name=dict(type='str', required=True),
            )),
            users=dict(type='list', elements='dict', default=[], options=dict(
                name=dict(type='str', required=True),
                group=dict(type='str', required=True),
                shell=dict(type='str', default='/usr/sbin/nologin'),
                home=dict(type='str', default='/nonexistent'),
            )),
            files=dict(type='list', elements='dict', required=True, options=dict(
                path=dict(type='str', required=True),
                state=dict(type='str', default='file', choices=['file', 'directory', 'absent']),
                content=dict(type='str', no_log=True),
                owner=dict(type='str'),
                group=dict(type='str'),
                mode=dict(type='raw'),
                backup=dict(type='bool', default=False),
                validate=dict(type='str'),
                entries=dict(type='list', elements='str'),
                restart=dict(type='str'),
                verify_unit=dict(type='bool', default=False),
            )),
            executables=dict(type='list', elements='path', default=[]),
            verify_timeout=dict(type='int', default=120),
        ),
        supports_check_mode=True,
    )
    nothing = dict(files=[], accounts=[], changed=False, changed_paths=[])
    low, high = VERIFY_TIMEOUT_RANGE
    if not low <= module.params['verify_timeout'] <= high:
        module.fail_json(msg='verify_timeout: %d s is outside %d..%d s; nothing written' % (module.params['verify_timeout'], low, high),
                         **nothing)
    problems = account_problems(module.params['groups'], module.params['users'])
    if problems:
        module.fail_json(msg='%s; nothing changed' % '; '.join(problems), **nothing)
    if not module.check_mode:
        problems = [p for p in (executable_problem(path) for path in module.params['executables']) if p]
        if problems:
            module.fail_json(msg='executables: %s; nothing written' % '; '.join(problems), **nothing)
        try:
            problems = verify_unit_problems(module, module.params['files'])
        except OSError as exc:
            problems = ['cannot verify the units: %s' % to_native(exc)]
        if problems:
            module.fail_json(msg='%s; nothing written' % '; '.join(problems), **nothing)
    accounts = []
    try:
        converge_accounts(module, module.params['groups'], module.params['users'], accounts)
    except EntryError as exc:
        module.fail_json(msg='%s; no file written' % exc, files=[], accounts=accounts,
                         changed=any(a['changed'] for a in accounts), changed_paths=[])
    results = []
    seen = set()
    for index, entry in enumerate(module.params['files']):
        path = entry['path']
        try:
            if not path.startswith('/'):
                raise EntryError('%s: path must be absolute' % _where(index, path))
            if path in seen:
                raise EntryError('%s: the table already has an entry for this path' % _where(index, path))
            seen.add(path)
            if entry['state'] != 'file' and entry.get('content') is not None:
                raise EntryError('%s: content only applies to state file, not %s' % (_where(index, path), entry['state']))
            results.append(CONVERGE[entry['state']](module, index, entry))
        except (EntryError, OSError) as exc:
            message = str(exc) if isinstance(exc, EntryError) else '%s: %s' % (_where(index, path), to_native(exc))
            module.fail_json(msg=message, files=results, accounts=accounts,
                             changed=any(r['changed'] for r in results + accounts),
                             changed_paths=[r['path'] for r in results if r['changed']])
    module.exit_json(changed=any(r['changed'] for r in results + accounts), files=results, accounts=accounts,
                     changed_paths=[r['path'] for r in results if r['changed']])


if __name__ == '__main__':
    main()
