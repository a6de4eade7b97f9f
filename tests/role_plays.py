"""The play the role tests run: a role's own validate / desired_state tasks on localhost (no
node touched: both only compute on the controller), then what the role rendered, written out."""


def desired_state_play(role, out, keep, dest='desired.json', validate=False, public=False):
    """YAML text of that play. ``role``: its name or path; ``keep``: a Jinja expression (without
    the braces) copied to ``<out>/<dest>`` (mode 0600); ``validate``: run validate.yml first;
    ``public``: the role's vars stay visible to tasks appended to this play."""
    include = ''.join(
        '    - name: %s\n'
        '      ansible.builtin.include_role:\n'
        '        name: %s\n'
        '        tasks_from: %s\n%s' % (title, role, tasks, '        public: true\n' if public else '')
        for title, tasks in ((('Validate', 'validate.yml'),) if validate else ()) + (('Desired state', 'desired_state.yml'),))
    return ('- hosts: localhost\n'
            '  gather_facts: false\n'
            '  tasks:\n%s'
            '    - name: Keep what the role renders\n'
            '      ansible.builtin.copy:\n'
            '        content: "{{ %s }}"\n'
            '        dest: "%s/%s"\n'
            '        mode: "0600"\n' % (include, keep, out, dest))
