#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)


DOCUMENTATION = r'''
---
module: node_state
short_description: Say in one read-only round trip whether a node already matches a desired state
version_added: "0.1.0"
description:
  - Compares the node with the desired state the controller computed - files (content sha1,
    type, mode, owner, group), users, groups, systemd units, health URLs and Python package
    versions - and reports per named check whether it is in sync, with one line per difference.
  - Meant to let roles skip their converge tasks on an unchanged node. A check is in sync only
    when everything it names was read and matched; whatever cannot be read (permission denied,
    systemctl failing, an interpreter that does not run) is drift with the reason.
  - The units of all checks are read with one C(systemctl show) call; each Python interpreter
    is run once for all its packages.
  - Never changes anything on the node and never returns file contents, only hashes, modes and
    owners.
  - Input that cannot be compared (a relative path, a mode like C(644x), an unknown file state,
    duplicate check names) fails the module, naming the check, the field and the value, before
    anything is read.
options:
  checks:
    description: The checks to run, each under its own name.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Name of the check, for example C(gpustack_worker); unique among O(checks).
        type: str
        required: true
      files:
        description: Paths and what they must be.
        type: list
        elements: dict
        default: []
        suboptions:
          path:
            description:
              - Absolute path.
              - A symlink where a file or directory is wanted is drift; the link is not followed.
            type: str
            required: true
          state:
            description:
              - C(file), C(directory) or C(absent).
              - Any other value fails the module naming the check.
            type: str
            default: file
          sha1:
            description:
              - Hex sha1 of the wanted content (only with O(checks[].files[].state=file)).
              - Without it only presence, type, mode, owner and group are compared.
            type: str
          read_sha1:
            description:
              - Read the content's sha1 without a wanted value (only with
                O(checks[].files[].state=file)), for a check that only says what to observe (the
                O(kvpin.fleet.gpu_facts#module:observe) option, compared later on the controller).
              - Compares nothing by itself.
            type: bool
            default: false
          size:
            description:
              - Wanted size of the file in bytes (only with O(checks[].files[].state=file)).
              - Content is hashed up to 64 MiB per file and 256 MiB and 30 seconds per call
                (10 seconds per file); a file over that is reported as not hashed and is drift
                only where its size or O(checks[].files[].mtime) differs from the wanted one, or
                where neither is given.
            type: int
          mtime:
            description:
              - Wanted modification time in seconds since the epoch (only with
                O(checks[].files[].state=file)); see O(checks[].files[].size).
            type: float
          mode:
            description:
              - Wanted permission bits as an octal string, for example C("0600") or C("755").
              - An integer is taken as the mode's value, as M(ansible.builtin.file) takes it
                (YAML reads an unquoted C(0600) as 384, which is 0600).
            type: raw
          owner:
            description: Wanted owner, a user name.
            type: str
          group:
            description: Wanted group, a group name.
            type: str
          entries:
            description:
              - Only with O(checks[].files[].state=directory) - the names the directory must hold.
              - An entry on the node that is not listed is drift (reported as C(<path>) followed by
                C(unexpected entries a, b)), so something removed from the inventory is noticed; a
                listed entry that is missing is checked by its own file entry.
            type: list
            elements: str
      users:
        description:
          - Users that must exist, each a name or a dict with C(name) and any of C(group) (its
            primary group, by name), C(shell) and C(home), which must then be as given; a
            difference is drift naming the user, the attribute, what it is and what is wanted.
        type: list
        elements: raw
        default: []
      groups:
        description: Group names that must exist.
        type: list
        elements: str
        default: []
      units:
        description:
          - systemd units and the state they must be in.
          - Whatever else is wanted, a unit whose file changed on disk without a daemon-reload
            (C(NeedDaemonReload=yes)) is drift, and a unit wanted enabled or active must have
            C(LoadState=loaded).
        type: list
        elements: dict
        default: []
        suboptions:
          name:
            description: Full unit name, for example C(gpustack.service).
            type: str
            required: true
          enabled:
            description:
              - C(true) - C(UnitFileState) must be C(enabled), the only state that survives a reboot as
                enabled; C(enabled-runtime), C(linked), C(static), C(generated), C(indirect) and C(alias) are drift.
              - C(false) - C(UnitFileState) must not be C(enabled) or C(enabled-runtime).
              - Unset - not compared.
            type: bool
          active:
            description:
              - C(true) - C(ActiveState) must be C(active).
              - C(false) - C(ActiveState) must not be C(active), C(activating) or C(reloading).
              - Unset - not compared.
            type: bool
      http:
        description:
          - URLs that must answer a GET with a status. No proxies are used and redirects are
            not followed (a redirect is compared as its own status).
          - No answer (connection refused, timeout) is drift naming the URL and what happened.
        type: list
        elements: dict
        default: []
        suboptions:
          url:
            description: C(http://) or C(https://) URL.
            type: str
            required: true
          status:
            description: Wanted HTTP status.
            type: int
            default: 200
          timeout:
            description: Seconds to wait for the answer.
            type: float
            default: 5
      python_packages:
        description:
          - Distributions that must be installed (at an exact version when one is given), as the given interpreter
            sees them through C(importlib.metadata.version) (run with C(-I), so C(PYTHONPATH)
            and the user's site directory do not count).
          - Versions are compared as strings.
        type: list
        elements: dict
        default: []
        suboptions:
          python:
            description: Absolute path of the interpreter, for example a virtualenv's C(bin/python).
            type: str
            required: true
          name:
            description: Distribution name, for example C(gpustack).
            type: str
            required: true
          version:
            description:
              - Wanted version, for example C(0.7.1).
              - Omitted or null, the distribution must be installed at any version.
            type: str
  wait_timeout:
    description:
      - Seconds to keep reading until every check is in sync, one try every O(wait_delay) seconds
        (a health wait in one round trip; the result is the last try's).
      - V(0) reads once. At most 3600; a value outside 0..3600 fails naming the option.
    type: float
    default: 0
  wait_delay:
    description: Seconds between tries while O(wait_timeout) runs (0.1..300).
    type: float
    default: 2
attributes:
  check_mode:
    support: full
    description: Only reads; check mode gives the same answer.
  diff_mode:
    support: none
    description: Nothing changes, so there is nothing to diff.
notes:
  - Reading files the remote user cannot read is drift (C(cannot be read)), so run it with the
    same privileges as the tasks it stands for.
  - HTTPS URLs are verified against the node's default CA store.
author:
  - kvpin.fleet contributors (!UNKNOWN)
'''

EXAMPLES = r'''
- name: Is the worker already as the role would write it?
  kvpin.fleet.node_state:
    checks:
      - name: gpustack_worker
        files:
          - path: /etc/gpustack/config.yaml
            sha1: "{{ lookup('ansible.builtin.template', 'config.yaml.j2') | hash('sha1') }}"
            mode: "0600"
            owner: root
            group: root
          - path: /etc/gpustack
            state: directory
            mode: "0755"
        units:
          - name: gpustack.service
            enabled: true
            active: true
        http:
          - url: http://127.0.0.1:10150/healthz
        python_packages:
          - python: /opt/gpustack/bin/python
            name: gpustack
            version: 0.7.1
      - name: serving_watchdog
        users: [kvpin-watchdog]
        units:
          - name: kvpin-watchdog.service
            enabled: true
            active: true
  register: kvpin_node_state

- name: Converge only when something differs
  ansible.builtin.include_tasks: converge.yml
  when: not kvpin_node_state.checks.gpustack_worker.in_sync
'''

RETURN = r'''
in_sync:
  description: Every check is in sync.
  returned: success
  type: bool
  sample: false
checks:
  description: Per check name, whether it is in sync and one line per difference.
  returned: success
  type: dict
  sample:
    gpustack_worker:
      in_sync: false
      drift:
        - "/etc/gpustack/config.yaml: mode 0644, wanted 0600"
        - "gpustack.service: ActiveState inactive (dead), wanted active"
      drift_items:
        - {object: /etc/gpustack/config.yaml, field: mode, want: "0600", got: "0644"}
        - {object: gpustack.service, field: ActiveState, want: active, got: inactive}
    serving_watchdog:
      in_sync: true
      drift: []
      drift_items: []
  contains:
    in_sync:
      description: Everything the check names matches.
      returned: always
      type: bool
    drift:
      description:
        - One line per difference, naming the object and both values where there are values.
        - "Examples - /etc/x: content differs (sha1 <sha1 on the node> wanted <wanted sha1>);
          /etc/x: mode 0644, wanted 0600; /etc/x: missing; /etc/x: is a directory, wanted a file;
          user kvpin-watchdog: missing; gpustack.service: not enabled (UnitFileState disabled);
          http://127.0.0.1:10150/healthz: status 503, wanted 200;
          gpustack 0.7.1 in /opt/gpustack/bin/python: installed 0.7.0."
        - The lines are for people and may be reworded; decide on C(drift_items).
      returned: always
      type: list
      elements: str
    drift_items:
      description:
        - The same differences as C(drift), in the same order, as data - what a role decides on
          (never the text of a line). Each is C(object), C(field), C(want), C(got).
        - C(object) is the file path, C(user NAME), C(group NAME), the unit name, the URL, or
          C(NAME in PYTHON) for a Python package.
        - C(field) is C(state) (the object exists, is of the wanted kind, can be read; C(got=missing)
          where it does not exist), C(sha1), C(mode), C(owner), C(group), C(entries) (C(got) all the
          names the directory holds) for a file; C(group), C(shell), C(home) for a user;
          C(NeedDaemonReload), C(LoadState), C(UnitFileState) (C(want) C(enabled) or
          C(not enabled)), C(ActiveState) (C(want) C(active) or C(not active)) for a unit;
          C(status) for a URL; C(version) for a package.
        - C(got) is null where the value could not be read (the line says why).
      returned: always
      type: list
      elements: dict
tries:
  description: How many times the checks were read (1 without O(wait_timeout)).
  returned: success
  type: int
  sample: 3
waited:
  description: Seconds from the first read to the last.
  returned: success
  type: float
  sample: 4.02
drift:
  description: The drift lines of all checks, each prefixed with its check name, a colon and a space.
  returned: success
  type: list
  elements: str
  sample:
    - "gpustack_worker: /etc/gpustack/config.yaml: mode 0644, wanted 0600"
    - "gpustack_worker: gpustack.service: ActiveState inactive (dead), wanted active"
drift_items:
  description: The C(drift_items) of all checks, in the order of RV(drift), each with its C(check) name added.
  returned: success
  type: list
  elements: dict
  sample:
    - {check: gpustack_worker, object: /etc/gpustack/config.yaml, field: mode, want: "0600", got: "0644"}
    - {check: gpustack_worker, object: gpustack.service, field: ActiveState, want: active, got: inactive}
'''

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.kvpin.fleet.plugins.module_utils.facts.node_state import (
    NodeStateInputError,
    NodeStateWaitError,
    check_wait,
    evaluate_until_in_sync,
    module_command_runner,
    parse_checks,
    summarize,
)


def argument_spec():
    return dict(
        checks=dict(type='list', elements='dict', required=True, options=dict(
            name=dict(type='str', required=True),
            files=dict(type='list', elements='dict', default=[], options=dict(
                path=dict(type='str', required=True),
                # Not `choices`: an unknown state fails in parse_checks, naming the check.
                state=dict(type='str', default='file'),
                sha1=dict(type='str'),
                read_sha1=dict(type='bool', default=False),
                size=dict(type='int'),
                mtime=dict(type='float'),
                mode=dict(type='raw'),
                owner=dict(type='str'),
                group=dict(type='str'),
                entries=dict(type='list', elements='str'),
            )),
            users=dict(type='list', elements='raw', default=[]),
            groups=dict(type='list', elements='str', default=[]),
            units=dict(type='list', elements='dict', default=[], options=dict(
                name=dict(type='str', required=True),
                enabled=dict(type='bool'),
                active=dict(type='bool'),
            )),
            http=dict(type='list', elements='dict', default=[], options=dict(
                url=dict(type='str', required=True),
                status=dict(type='int', default=200),
                timeout=dict(type='float', default=5),
            )),
            python_packages=dict(type='list', elements='dict', default=[], options=dict(
                python=dict(type='str', required=True),
                name=dict(type='str', required=True),
                version=dict(type='str'),
            )),
        )),
        wait_timeout=dict(type='float', default=0),
        wait_delay=dict(type='float', default=2),
    )


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    try:
        checks = parse_checks(module.params['checks'])
    except NodeStateInputError as exc:
        module.fail_json(msg=str(exc), check=exc.check, field=exc.field)
    try:
        timeout, delay = check_wait(module.params['wait_timeout'], module.params['wait_delay'])
    except NodeStateWaitError as exc:
        module.fail_json(msg=str(exc), field=exc.field)
    results, tries, waited = evaluate_until_in_sync(checks, timeout, delay, run_command=module_command_runner(module))
    module.exit_json(changed=False, tries=tries, waited=round(waited, 2), **summarize(results))


if __name__ == '__main__':
    main()
