# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet's plan as one self-contained HTML page (inline SVG and CSS, nothing external).

Input: one dict per node, as playbooks/plan.yml collects them::

    {host, gpus: ansible_facts.kvpin_gpus.gpus, plans: kvpin_plans.results,
     ledger: kvpin_gpu_ledger (the filter's dict) or None}

Per GPU one horizontal stacked bar (``<g data-gpu="host:index">``), drawn at one fixed scale
for the whole page (``data-bytes-per-px`` on ``<main>`` and on every ``<svg>``), so a bar's
length is the card's size and every segment's length is its bytes over that scale. The
segments (``<rect data-term=... data-bytes=...>``), left to right:

- per deployment placed on the GPU (feasible plans only: an infeasible one is not deployed,
  as in the ledger), the plan's resident terms ``weights``, ``activation``, ``non_torch``,
  ``cuda_graph``, ``kv_cache``, exactly the bytes of its ``plan.memory`` row, and (vLLM) the
  CUDA context it holds outside its budget (``terms.outside_cuda_context``);
- ``other_processes``: what processes outside GPUStack hold there (the ledger's
  ``outside_processes``);
- the rest of the card (its CUDA-visible total, the ledger's ``card``) split into
  ``system_reserved`` (the part GPUStack keeps off its books, the worker's
  ``system_reserved.vram``; at most what is left) and ``headroom`` (what is left after that).
  With one deployment and no other process the two add up to the plan's own headroom plus
  what the KV blocks leave unallocated of a vLLM budget (under a MiB).

A GPU whose terms add up to more than its card is drawn past the card's end (marked in red),
with no headroom segment. Every string in the page (host, deployment and model names, args,
warnings, explanations) is HTML-escaped; only named fields of the plan results are read (never
the inventory's engine dict or the task's invocation), so nothing but the plans gets in.
"""

from __future__ import annotations

import json
from html import escape

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import cuda_total
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError, RESIDENT_TERMS, type_name
from ansible_collections.kvpin.fleet.plugins.module_utils.units import GiB, fmt_bytes, fmt_gib

# Segment terms in drawing order, their colour and what the legend says of them.
TERMS = (
    ('weights', '#4e79a7', 'model weights'),
    ('activation', '#f28e2b', 'activation (peak of the profiling forward pass / compute buffer)'),
    ('non_torch', '#76b7b2', 'non-torch (CUDA context, NCCL, driver)'),
    ('cuda_graph', '#59a14f', 'CUDA graphs'),
    ('cuda_context', '#3d7f7a', 'CUDA context outside vLLM\'s budget (terms.outside_cuda_context)'),
    ('kv_cache', '#edc948', 'KV cache'),
    ('cold_compile_margin', '#f6e7a8', 'budget kept for a cold torch.compile (terms.cold_compile_margin: '
                                       'a warm start may fill it with KV)'),
    ('other_processes', '#b07aa1', 'memory held by processes outside GPUStack'),
    ('system_reserved', '#9c755f', 'system_reserved (kept off GPUStack\'s books)'),
    ('headroom', '#d9d9d9', 'headroom (free)'),
)
COLOURS = dict((name, colour) for name, colour, _unused in TERMS)
BAR_PX = 640            # the largest extent on the page (a card, or an overcommitted stack)
LABEL_PX = 250          # left of the bars: "index name, total"
ROW_PX = 24
BAR_HEIGHT = 16
MAX_NODES = 1024
MAX_ITEMS = 4096        # GPUs per node, results per node, lines per list
MAX_TEXT = 4000         # characters of one string shown


class PlanHtmlError(ValueError):
    """Input the report cannot draw; ``field`` names it."""

    def __init__(self, field_name, message):
        super().__init__('%s: %s' % (field_name, message))
        self.field = field_name


def _text(value):
    """Any value as escaped text, bounded in length."""
    if value is None:
        return ''
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT - 3] + '...'
    return escape(text, quote=True)


def _bytes(value, where):
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 50) < value < (1 << 50):
        raise PlanHtmlError(where, 'must be a whole number of bytes, got %r' % (value,))
    return value


def _list(value, where):
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise PlanHtmlError(where, 'must be a list, got %s' % type_name(value))
    if len(value) > MAX_ITEMS:
        raise PlanHtmlError(where, 'has %d items (limit %d)' % (len(value), MAX_ITEMS))
    return list(value)


def _dict(value, where):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanHtmlError(where, 'must be a dict, got %s' % type_name(value))
    return value


def _gib_or_unknown(value):
    return fmt_gib(value) if isinstance(value, int) and not isinstance(value, bool) else '?'


# ---------------------------------------------------------------- the model of the page

def _deployments(node, where):
    """[(name, result dict, plan dict or None)] of a node's serving_plan results."""
    out = []
    for position, result in enumerate(_list(node.get('plans'), where + '.plans')):
        here = '%s.plans[%d]' % (where, position)
        result = _dict(result, here)
        deployment = _dict(result.get('deployment'), here + '.deployment')
        name = deployment.get('name')
        name = name if isinstance(name, str) and name.strip() else 'deployment %d' % (position + 1)
        plan = result.get('plan')
        out.append((name, result, _dict(plan, here + '.plan') if plan is not None else None))
    return out


def gpu_bars(node, where='nodes[0]'):
    """[{index, name, card, segments: [(term, deployment or None, bytes)], overcommitted,
    not_deployed}] of one node: the bars as drawn."""
    ledger_gpus = _list(_dict(node.get('ledger'), where + '.ledger').get('gpus'), where + '.ledger.gpus')
    ledger_rows = dict((row.get('index'), row) for row in ledger_gpus if isinstance(row, dict))
    deployments = _deployments(node, where)
    bars = []
    for position, gpu in enumerate(_list(node.get('gpus'), where + '.gpus')):
        here = '%s.gpus[%d]' % (where, position)
        gpu = _dict(gpu, here)
        index = gpu.get('index')
        if isinstance(index, bool) or not isinstance(index, int):
            raise PlanHtmlError(here + '.index', 'must be an int, got %r' % (index,))
        row = ledger_rows.get(index)
        if row is not None:
            card = _bytes(row.get('card'), '%s.ledger.gpus[index %d].card' % (where, index))
            outside = _bytes(row.get('outside_processes', 0), '%s.ledger.gpus[index %d].outside_processes' % (where, index))
            reserved = _bytes(row.get('system_reserved', 0), '%s.ledger.gpus[index %d].system_reserved' % (where, index))
        else:
            try:
                card = cuda_total.of_gpu(gpu, here).cuda_total
            except PlanInputError as exc:
                raise PlanHtmlError(exc.field, str(exc)[len(exc.field) + 2:])
            outside = reserved = 0
        segments, not_deployed = [], []
        for name, result, plan in deployments:
            if plan is None:
                continue
            for row_position, mem in enumerate(_list(plan.get('memory'), '%s.plans[%s].plan.memory' % (where, name))):
                mem = _dict(mem, '%s.plans[%s].plan.memory[%d]' % (where, name, row_position))
                if mem.get('index') != index:
                    continue
                if plan.get('feasible') is not True:
                    not_deployed.append(name)
                    continue
                for term in RESIDENT_TERMS:
                    segments.append((term, name, _bytes(mem.get(term, 0), '%s.plans[%s].plan.memory[%d].%s'
                                                        % (where, name, row_position, term))))
                context = _dict(mem.get('terms'), '%s.plans[%s].plan.memory[%d].terms'
                                % (where, name, row_position)).get('outside_cuda_context')
                if context:
                    segments.append(('cuda_context', name, _bytes(context, '%s.plans[%s].plan.memory[%d].terms.'
                                                                  'outside_cuda_context' % (where, name, row_position))))
                cold = _dict(mem.get('terms'), '%s.plans[%s].plan.memory[%d].terms'
                             % (where, name, row_position)).get('cold_compile_margin')
                if cold:
                    segments.append(('cold_compile_margin', name, _bytes(cold, '%s.plans[%s].plan.memory[%d].terms.'
                                                                         'cold_compile_margin' % (where, name, row_position))))
        if outside:
            segments.append(('other_processes', None, outside))
        used = sum(size for _term, _name, size in segments)
        left = card - used
        if left > 0:
            fence = min(reserved, left)
            if fence:
                segments.append(('system_reserved', None, fence))
            if left - fence:
                segments.append(('headroom', None, left - fence))
        bars.append(dict(index=index, name=gpu.get('name') or '', card=card, segments=segments,
                         overcommitted=left < 0 or (row is not None and row.get('fits') is False),
                         not_deployed=not_deployed))
    return bars


def _extent(gpu_bar):
    return max(gpu_bar['card'], sum(size for _term, _name, size in gpu_bar['segments']))


# ---------------------------------------------------------------- drawing

def _svg_bars(host, bars, bytes_per_px):
    height = max(1, len(bars)) * ROW_PX + 4
    width = LABEL_PX + BAR_PX + 12
    parts = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" data-bytes-per-px="%r" role="img" '
             'aria-label="%s GPU memory">' % (width, height, bytes_per_px, _text(host))]
    for row, gpu_bar in enumerate(bars):
        top = row * ROW_PX + 4
        label = '%d %s, %s' % (gpu_bar['index'], gpu_bar['name'], fmt_gib(gpu_bar['card']))
        parts.append('<g data-gpu="%s" data-card-bytes="%d" class="%s">' % (
            _text('%s:%d' % (host, gpu_bar['index'])), gpu_bar['card'], 'gpu bad' if gpu_bar['overcommitted'] else 'gpu'))
        parts.append('<text x="0" y="%d" class="label">%s</text>' % (top + BAR_HEIGHT - 3, _text(label[:40])))
        x = float(LABEL_PX)
        for term, deployment, size in gpu_bar['segments']:
            w = size / bytes_per_px
            tip = '%s%s: %s (%d B)' % ('%s - ' % deployment if deployment else '', term, fmt_bytes(size), size)
            parts.append('<rect data-term="%s"%s data-bytes="%d" x="%.3f" y="%d" width="%.3f" height="%d" '
                         'fill="%s"><title>%s</title></rect>' % (
                             term, ' data-deployment="%s"' % _text(deployment) if deployment else '', size, x, top,
                             w, BAR_HEIGHT, COLOURS[term], _text(tip)))
            x += w
        card_end = LABEL_PX + gpu_bar['card'] / bytes_per_px
        parts.append('<line x1="%.3f" x2="%.3f" y1="%d" y2="%d" class="card-end"/>' % (
            card_end, card_end, top - 2, top + BAR_HEIGHT + 2))
        parts.append('</g>')
    parts.append('</svg>')
    return ''.join(parts)


def _legend():
    items = ''.join('<li><svg width="14" height="14" aria-hidden="true"><rect width="14" height="14" fill="%s"/>'
                    '</svg> <code>%s</code> %s</li>' % (colour, name, _text(text)) for name, colour, text in TERMS)
    return ('<ul class="legend">%s<li><span class="bad">red</span>: infeasible, or a GPU whose terms add up to more '
            'than its CUDA-visible total (the bar runs past the card\'s end mark)</li></ul>' % items)


def _items(title, values, css=''):
    values = _list(values, title)
    if not values:
        return ''
    listed = ''.join('<li>%s</li>' % _text(v) for v in values)
    return '<h4>%s</h4><ul%s>%s</ul>' % (_text(title), ' class="%s"' % css if css else '', listed)


def _memory_table(plan):
    columns = ('total', 'budget') + tuple(RESIDENT_TERMS) + ('headroom',)
    rows = []
    for mem in _list(plan.get('memory'), 'plan.memory'):
        mem = _dict(mem, 'plan.memory[]')
        cells = ''.join('<td title="%s B">%s</td>' % (_text(mem.get(c)), _gib_or_unknown(mem.get(c))) for c in columns)
        explain = _dict(mem.get('explain'), 'plan.memory[].explain')
        terms = _dict(mem.get('terms'), 'plan.memory[].terms')
        why = ''.join('<li><code>%s</code>: %s</li>' % (_text(k), _text(explain[k])) for k in sorted(explain))
        finer = ', '.join('%s %s' % (_text(k), fmt_bytes(v) if isinstance(v, int) and not isinstance(v, bool) else '?') for k, v in sorted(terms.items()))
        rows.append('<tr><th>%s %s</th>%s</tr><tr><td colspan="%d"><details><summary>how each term was computed'
                    '</summary><ul>%s</ul><p>terms: %s</p></details></td></tr>' % (
                        _text(mem.get('index')), _text(mem.get('name')), cells, len(columns) + 1, why, finer))
    head = ''.join('<th>%s</th>' % c for c in columns)
    return '<table class="mem"><tr><th>GPU</th>%s</tr>%s</table>' % (head, ''.join(rows))


def _measured_html(plan):
    """Declared vs measured traffic and planned vs actual KV pool (``plan.measured``), or ''."""
    measured = _dict(plan.get('measured'), 'plan.measured')
    if not measured:
        return ''
    out = []
    traffic = _dict(measured.get('traffic'), 'plan.measured.traffic')
    if traffic:
        rows = []
        for row in _list(traffic.get('figures'), 'plan.measured.traffic.figures'):
            row = _dict(row, 'plan.measured.traffic.figures[]')
            drift = row.get('drift')
            rows.append('<tr data-figure="%s"%s><th>%s</th><td class="declared">%s</td><td class="measured">%s</td>'
                        '<td class="used">%s</td><td class="drift">%s</td><td style="text-align:left">%s</td></tr>' % (
                            _text(row.get('figure')), ' class="bad"' if drift else '', _text(row.get('label')),
                            _text(row.get('declared')), _text(row.get('measured')) or '-', _text(row.get('used')),
                            _text('measured %s declared' % drift) if drift else '', _text(row.get('reason'))))
        out.append('<h4>traffic: declared vs measured (source %s, %s requests)</h4><table class="mem traffic">'
                   '<tr><th>figure</th><th>declared</th><th>measured</th><th>used</th><th>drift</th><th>why</th></tr>'
                   '%s</table>' % (_text(traffic.get('traffic_source')), _text(traffic.get('requests')), ''.join(rows)))
        proposal = _list(traffic.get('traffic_classes_proposal'), 'plan.measured.traffic.traffic_classes_proposal')
        if proposal:
            out.append(_items('traffic_classes proposal (not applied)', proposal))
    kv = _dict(measured.get('kv_pool'), 'plan.measured.kv_pool')
    if kv:
        drift = kv.get('drift')
        out.append('<table class="mem kv-pool%s"><tr><th>KV pool</th><th>planned tokens</th><th>actual tokens</th>'
                   '<th>drift</th><th>same card / version / args</th></tr><tr><th></th><td class="planned">%s</td>'
                   '<td class="actual">%s</td><td class="drift">%s</td><td>%s</td></tr></table>%s' % (
                       ' bad' if kv.get('flagged') else '', _text(kv.get('planned_kv_cache_tokens')),
                       _text(kv.get('actual_kv_cache_tokens')),
                       '%+.1f %%' % (100 * drift) if isinstance(drift, (int, float)) and not isinstance(drift, bool)
                       else '-', 'yes' if kv.get('same_config') is True else _text('no: %s' % '; '.join(
                           str(m) for m in _list(kv.get('mismatch'), 'plan.measured.kv_pool.mismatch'))),
                       '<p class="warn">%s</p>' % _text(kv['action']) if kv.get('action') else ''))
    return ''.join(out)


def _deployment_html(name, result, plan):
    deployment = _dict(result.get('deployment'), 'deployment')
    model = deployment.get('model')
    model_text = model if isinstance(model, str) else '(a config dict)'
    if plan is None:
        why = result.get('msg') or ('skipped' if result.get('skipped') else 'no plan')
        return ('<details open class="deployment infeasible"><summary><b>%s</b> %s %s: NO PLAN</summary><p>%s</p></details>'
                % (_text(name), _text(deployment.get('backend')), _text(model_text), _text(why)))
    feasible = plan.get('feasible') is True
    verdict = 'FEASIBLE' if feasible else 'INFEASIBLE'
    reasons = _dict(plan.get('reasons'), 'plan.reasons')
    body = ['<p class="args"><b>args</b> <code>%s</code></p>' % _text(' '.join(str(a) for a in _list(plan.get('args'), 'plan.args'))),
            '<p>kv_cache_tokens %s; max_concurrency_at_max_len %s</p>' % (
                _text(plan.get('kv_cache_tokens')), _text(plan.get('max_concurrency_at_max_len'))),
            _items('does not fit', plan.get('not_fitting'), 'bad'),
            _items('what would fit', plan.get('suggestions'), 'fit'),
            _items('warnings', plan.get('warnings'), 'warn'),
            _measured_html(plan),
            _memory_table(plan),
            '<h4>reasons</h4><ul>%s</ul>' % ''.join(
                '<li><code>%s</code>: %s</li>' % (_text(k), _text(reasons[k])) for k in sorted(reasons)),
            _items('version rules', plan.get('rules'))]
    return ('<details%s class="deployment%s"><summary><b>%s</b> %s %s, <code>%s</code>: <span class="verdict">%s'
            '</span></summary>%s</details>' % (
                '' if feasible else ' open', '' if feasible else ' infeasible', _text(name), _text(plan.get('backend')),
                _text(plan.get('backend_version')), _text(model_text), verdict, ''.join(body)))


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em;color:#222}
main{display:grid;grid-template-columns:repeat(auto-fill,minmax(920px,1fr));gap:1em}
section.node{border:1px solid #ccc;border-radius:6px;padding:.5em 1em;overflow-x:auto}
section.node.alarm{border-color:#c00;border-width:2px}
h2{margin:.2em 0;font-size:1.1em}
h4{margin:.4em 0 .1em}
.legend{list-style:none;padding:0;display:flex;flex-wrap:wrap;gap:.3em 1.2em}
.legend svg{vertical-align:middle}
.bad,details.infeasible>summary{color:#c00}
details.deployment{margin:.3em 0;padding:.2em .5em;border-left:3px solid #4e79a7}
details.infeasible{border-left-color:#c00}
.fit{color:#060}
.warn{color:#850}
table.mem{border-collapse:collapse;font-size:12px}
table.mem td,table.mem th{border:1px solid #ddd;padding:1px 4px;text-align:right}
details.overview table td:first-child{text-align:left}
code{word-break:break-all}
svg .label{font-size:12px}
.gpu.bad .label{fill:#c00;font-weight:bold}
.card-end{stroke:#333;stroke-width:1}
.gpu.bad .card-end{stroke:#c00;stroke-width:2}
"""


def render_plan_report(nodes, title='kvpin.fleet plan'):
    """The HTML page (a str) for ``nodes`` (see the module docstring); PlanHtmlError naming
    the field for input it cannot draw."""
    nodes = _list(nodes, 'nodes')
    if len(nodes) > MAX_NODES:
        raise PlanHtmlError('nodes', '%d nodes (limit %d)' % (len(nodes), MAX_NODES))
    drawn = []
    for position, node in enumerate(nodes):
        where = 'nodes[%d]' % position
        node = _dict(node, where)
        host = node.get('host')
        if not isinstance(host, str) or not host.strip():
            raise PlanHtmlError(where + '.host', 'must be the inventory hostname, got %r' % (host,))
        drawn.append((host, node, gpu_bars(node, where), _deployments(node, where)))
    extent = max([_extent(gpu_bar) for _h, _n, bars, _d in drawn for gpu_bar in bars] or [GiB])
    bytes_per_px = max(extent, 1) / float(BAR_PX)
    n_gpus = sum(len(bars) for _h, _n, bars, _d in drawn)
    n_bad_gpus = sum(1 for _h, _n, bars, _d in drawn for gpu_bar in bars if gpu_bar['overcommitted'])
    n_plans = sum(len(deps) for _h, _n, _b, deps in drawn)
    n_infeasible = sum(1 for _h, _n, _b, deps in drawn for _name, _r, plan in deps
                       if plan is None or plan.get('feasible') is not True)
    sections, overview = [], []
    for number, (host, node, bars, deployments) in enumerate(drawn):
        ledger = _dict(node.get('ledger'), 'ledger')
        problems = _list(ledger.get('problems'), host + '.ledger.problems')
        bad = problems or any(gpu_bar['overcommitted'] for gpu_bar in bars) or any(
            plan is None or plan.get('feasible') is not True for _name, _r, plan in deployments)
        not_deployed = ''.join('<p class="bad">GPU %d: not deployed (infeasible): %s</p>' % (
            gpu_bar['index'], _text(', '.join(gpu_bar['not_deployed']))) for gpu_bar in bars if gpu_bar['not_deployed'])
        infeasible = sum(1 for _name, _r, plan in deployments if plan is None or plan.get('feasible') is not True)
        overcommitted = sum(1 for gpu_bar in bars if gpu_bar['overcommitted'])
        overview.append('<tr%s><td><a href="#node-%d">%s</a></td><td>%d</td><td>%d</td><td>%d</td><td>%d</td>'
                        '<td>%s</td></tr>' % (' class="bad"' if bad else '', number, _text(host), len(bars), len(deployments),
                                              infeasible, overcommitted, 'REVIEW' if bad else 'ok'))
        sections.append('<section class="node%s" id="node-%d" data-host="%s"><h2>%s</h2>%s%s%s%s%s</section>' % (
            ' alarm' if bad else '', number, _text(host), _text(host), _svg_bars(host, bars, bytes_per_px), not_deployed,
            _items('the per-GPU ledger refuses', problems, 'bad'),
            _items('ledger warnings', ledger.get('warnings'), 'warn'),
            ''.join(_deployment_html(name, result, plan) for name, result, plan in deployments)))
    summary = ('%d nodes, %d GPUs, %d deployments; <span class="%s">%d infeasible</span>, <span class="%s">%d GPUs '
               'overcommitted</span>. One scale for every bar: %s per 100 px.' % (
                   len(drawn), n_gpus, n_plans, 'bad' if n_infeasible else 'fit', n_infeasible,
                   'bad' if n_bad_gpus else 'fit', n_bad_gpus, fmt_gib(bytes_per_px * 100)))
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<title>%s</title><style>%s</style></head><body><h1>%s</h1><p>%s</p>%s'
            '<details class="overview"%s><summary>nodes</summary><table class="mem"><tr><th>node</th><th>GPUs</th>'
            '<th>deployments</th><th>infeasible</th><th>GPUs overcommitted</th><th></th></tr>%s</table></details>'
            '<main data-bytes-per-px="%r">%s</main></body></html>\n' % (
                _text(title), STYLE, _text(title), summary, _legend(), ' open' if len(drawn) > 1 else '',
                ''.join(overview), bytes_per_px, ''.join(sections)))
