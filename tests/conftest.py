"""Make the checkout importable as ``ansible_collections.kvpin.fleet`` for pytest.

ansible-test needs the tree at a path ending in ansible_collections/kvpin/fleet; plain
pytest gets the same import path through a symlink under .cache/ (ignored by git)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_parts = ROOT.split(os.sep)
if _parts[-3:-2] == ['ansible_collections'] and _parts[-2:] == ['kvpin', 'fleet']:
    _COLL_ROOT = os.sep.join(_parts[:-3])
else:
    _COLL_ROOT = os.path.join(ROOT, '.cache', 'collections')
    _link = os.path.join(_COLL_ROOT, 'ansible_collections', 'kvpin', 'fleet')
    if not os.path.islink(_link):
        os.makedirs(os.path.dirname(_link), exist_ok=True)
        try:
            os.symlink(ROOT, _link)
        except FileExistsError:
            pass
if _COLL_ROOT not in sys.path:
    sys.path.insert(0, _COLL_ROOT)
