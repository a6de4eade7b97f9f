# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The HTML plan report (module_utils/plan_html.py) over real plans and the real ledger:
one bar per GPU at one scale whose segments are the plans' bytes, every string escaped,
nothing external, infeasible plans in red with what would fit, bad input named."""
from __future__ import annotations

from html.parser import HTMLParser

import pytest
from ansible.errors import AnsibleFilterError
from plan_report_nodes import FAKE_API_KEY, XSS, fleet

from ansible_collections.kvpin.fleet.plugins.filter.kvpin import FilterModule
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import PlanHtmlError, gpu_bars, render_plan_report
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import RESIDENT_TERMS

HTML_FILTER = FilterModule().filters()['kvpin_plan_report_html']


class Page(HTMLParser):
    """The bars as the page draws them: [{gpu, card, cls, rects: [attrs]}], and every tag seen."""

    def __init__(self):
        super().__init__()
        self.bars, self.tags, self.scale, self.details = [], [], None, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == 'main':
            self.scale = float(attrs['data-bytes-per-px'])
        elif tag == 'g' and 'data-gpu' in attrs:
            self.bars.append({'gpu': attrs['data-gpu'], 'card': int(attrs['data-card-bytes']),
                              'cls': attrs['class'], 'rects': []})
        elif tag == 'rect' and 'data-term' in attrs:
            self.bars[-1]['rects'].append(attrs)
        elif tag == 'details':
            self.details.append(attrs)


@pytest.fixture(scope='module')
def nodes():
    return fleet()


@pytest.fixture(scope='module')
def page(nodes):
    text = render_plan_report(nodes)
    parsed = Page()
    parsed.feed(text)
    return text, parsed


def test_one_bar_per_gpu_named_host_and_index(nodes, page):
    _text, parsed = page
    want = ['%s:%d' % (n['host'], g['index']) for n in nodes for g in n['gpus']]
    assert [gpu_bar['gpu'] for gpu_bar in parsed.bars] == want and len(want) == 7


def test_each_segment_is_its_bytes_at_one_scale_and_the_segments_follow_each_other(page):
    _text, parsed = page
    for gpu_bar in parsed.bars:
        x = None
        for rect in gpu_bar['rects']:
            assert float(rect['width']) == pytest.approx(int(rect['data-bytes']) / parsed.scale, abs=1e-3)
            if x is not None:
                assert float(rect['x']) == pytest.approx(x, abs=2e-3)
            x = float(rect['x']) + float(rect['width'])
    # The scale is the page's: the largest extent (a card, or an overcommitted stack) is BAR_PX wide.
    extents = [max(gpu_bar['card'], sum(int(r['data-bytes']) for r in gpu_bar['rects'])) for gpu_bar in parsed.bars]
    assert max(extents) / parsed.scale == pytest.approx(640, abs=1e-6)


def test_segments_fill_the_card_exactly_unless_it_is_overcommitted(page):
    _text, parsed = page
    for gpu_bar in parsed.bars:
        total = sum(int(r['data-bytes']) for r in gpu_bar['rects'])
        if 'bad' in gpu_bar['cls'].split():
            continue
        assert total == gpu_bar['card'], gpu_bar['gpu']
    bad = [gpu_bar for gpu_bar in parsed.bars if 'bad' in gpu_bar['cls'].split()]
    assert [gpu_bar['gpu'] for gpu_bar in bad] == ['gpu-node-2:2']     # two 0.5 plans on one card


def test_resident_segments_are_the_plans_bytes_and_the_rest_is_the_plans_headroom(nodes):
    node1 = nodes[0]
    bars = dict((gpu_bar['index'], gpu_bar) for gpu_bar in gpu_bars(node1))
    xss_plan = node1['plans'][1]['plan']
    row = xss_plan['memory'][0]
    gpu1 = bars[1]['segments']
    cold = row['terms']['cold_compile_margin']
    assert cold > 0      # vLLM 0.10.1.1 has no --kv-cache-memory-bytes: the budget keeps a cold-compile margin
    assert [(t, n, b) for t, n, b in gpu1 if n] == [(t, XSS, row[t]) for t in RESIDENT_TERMS] + [
        ('cuda_context', XSS, row['terms']['outside_cuda_context']), ('cold_compile_margin', XSS, cold)]
    # One deployment, no outside process: system_reserved + headroom is the plan's own headroom
    # plus what the KV blocks leave unallocated of the budget (vLLM 0.10: CUDA graphs outside it),
    # the cold-compile margin drawn apart.
    rest = sum(b for t, _n, b in gpu1 if t in ('system_reserved', 'headroom'))
    unallocated = row['budget'] - sum(row[t] for t in ('weights', 'activation', 'non_torch', 'kv_cache')) - cold
    assert 0 <= rest - row['headroom'] == unallocated < 1024 ** 2
    # The outside process on GPU 0 (2 GiB) is drawn, and the infeasible plan is not deployed.
    assert ('other_processes', None, 2 * 1024 ** 3) in bars[0]['segments']
    assert bars[1]['not_deployed'] == ['big'] and not any(n == 'big' for _t, n, _b in gpu1)
    # system_reserved is the ledger's (the worker's system_reserved.vram), no more than what is left.
    assert ('system_reserved', None, node1['ledger']['gpus'][1]['system_reserved']) in gpu1


def test_a_tensor_parallel_plan_draws_on_each_of_its_gpus(nodes):
    bars = gpu_bars(nodes[1])
    tp2 = nodes[1]['plans'][0]['plan']
    assert len(tp2['memory']) == 2
    for row in tp2['memory']:
        drawn = dict((t, b) for t, n, b in bars[row['index']]['segments'] if n == 'tp2')
        assert drawn == dict([(t, row[t]) for t in RESIDENT_TERMS]
                             + [('cuda_context', row['terms']['outside_cuda_context']),
                                ('cold_compile_margin', row['terms']['cold_compile_margin'])])


def test_every_string_is_escaped_so_an_xss_payload_is_inert(page):
    text, parsed = page
    assert XSS not in text
    assert '&lt;script&gt;window.kvpinPwned=1&lt;/script&gt;&lt;img src=x onerror=&quot;' in text
    tags = set(tag for tag, _attrs in parsed.tags)
    assert not tags & {'script', 'img', 'iframe', 'object', 'embed', 'link', 'base', 'form'}
    assert not any(name.startswith('on') for _tag, attrs in parsed.tags for name in attrs)


def test_nothing_external_and_no_secret_from_the_inventory_or_the_invocation(page):
    text, parsed = page
    # No attribute loads or links anything (the SVG namespace is a name, not a request) ...
    for tag, attrs in parsed.tags:
        assert not set(attrs) & {'src', 'xlink:href', 'srcset', 'action', 'style'}, tag
        assert attrs.get('href', '#').startswith('#'), attrs     # links only within the page
        assert all('://' not in (value or '') for name, value in attrs.items() if name != 'xmlns'), tag
    # ... nor does the one style sheet (plan text may cite an upstream URL: it is text).
    style = text[text.index('<style>'):text.index('</style>')]
    assert not any(needle in style for needle in ('url(', '@import', '@font-face', '://'))
    assert text.count('<style>') == 1
    assert FAKE_API_KEY not in text


def test_infeasible_plans_are_red_with_what_does_not_fit_and_what_would(nodes, page):
    text, parsed = page
    big = nodes[0]['plans'][2]['plan']
    assert big['feasible'] is False and big['not_fitting'] and big['suggestions']
    infeasible = [d for d in parsed.details if 'infeasible' in d.get('class', '').split()]
    assert len(infeasible) == 1 and 'open' in infeasible[0]
    start = text.index('<details open class="deployment infeasible">')
    section = text[start:text.index('</details></section>', start)]
    assert 'INFEASIBLE' in section
    assert '<ul class="bad"><li>%s</li>' % big['not_fitting'][0] in section
    assert '<ul class="fit"><li>%s</li>' % big['suggestions'][0] in section
    assert '.bad,details.infeasible&gt;summary{color:#c00}' not in text and 'details.infeasible>summary{color:#c00}' in text
    # The node and the overcommitted GPU are marked, with the ledger's refusal.
    assert text.count('class="node alarm"') == 2
    assert 'the per-GPU ledger refuses' in text and 'GPU 2 (NVIDIA RTX A6000): memory overcommitted by' in text


def test_args_warnings_reasons_and_explanations_are_shown_per_deployment(nodes, page):
    text, _parsed = page
    chat = nodes[0]['plans'][0]['plan']
    assert '<code>%s</code>' % ' '.join(chat['args']) in text
    for knob, reason in chat['reasons'].items():
        assert '<li><code>%s</code>: %s</li>' % (knob, reason.replace('&', '&amp;').replace('<', '&lt;')
                                                 .replace('>', '&gt;').replace('"', '&quot;')
                                                 .replace("'", '&#x27;')) in text
    for term in chat['memory'][0]['explain']:
        assert '<li><code>%s</code>:' % term in text


def test_the_overview_links_each_node_and_flags_those_to_review(nodes, page):
    text, parsed = page
    links = [attrs['href'] for tag, attrs in parsed.tags if tag == 'a']
    ids = [attrs['id'] for tag, attrs in parsed.tags if tag == 'section']
    assert links == ['#' + i for i in ids] == ['#node-0', '#node-1', '#node-2']
    assert '<tr class="bad"><td><a href="#node-0">gpu-node-1</a></td><td>2</td><td>3</td><td>1</td><td>0</td>' in text
    assert '<tr class="bad"><td><a href="#node-1">gpu-node-2</a></td><td>4</td><td>3</td><td>0</td><td>1</td>' in text
    assert '<tr><td><a href="#node-2">gpu-node-3</a></td><td>1</td><td>0</td><td>0</td><td>0</td><td>ok</td></tr>' in text


def test_a_task_that_failed_is_shown_in_red_with_its_message():
    node = {'host': 'n', 'gpus': [{'index': 0, 'name': 'x', 'memory_total': 24 << 30}],
            'plans': [{'deployment': {'name': 'typo'}, 'failed': True, 'msg': 'serving_plan: invalid model: <bad>'}]}
    text = render_plan_report([node])
    assert '<b>typo</b>' in text and 'NO PLAN' in text and 'serving_plan: invalid model: &lt;bad&gt;' in text
    assert 'class="node alarm"' in text


@pytest.mark.parametrize('nodes_in, field', [
    ('not a list', 'nodes'),
    ([{'gpus': []}], 'nodes[0].host'),
    ([{'host': 'n', 'gpus': [{'index': '0', 'memory_total': 1}]}], 'nodes[0].gpus[0].index'),
    ([{'host': 'n', 'gpus': [{'index': 0, 'memory_total': -1}]}], 'nodes[0].gpus[0].memory_total'),
    ([{'host': 'n', 'gpus': [{'index': 0, 'memory_total': 1 << 34}],
       'ledger': {'gpus': [{'index': 0, 'card': 'lots'}]}}], 'nodes[0].ledger.gpus[index 0].card'),
    ([{'host': 'n', 'gpus': [], 'plans': 'x'}], 'nodes[0].plans'),
    ([{'host': 'n', 'gpus': [{'index': 0, 'memory_total': 1 << 34}],
       'plans': [{'deployment': {'name': 'd'}, 'plan': {'feasible': True, 'memory': [{'index': 0, 'weights': 1.5}]}}]}],
     'nodes[0].plans[d].plan.memory[0].weights'),
])
def test_bad_input_is_refused_naming_the_field(nodes_in, field):
    with pytest.raises(PlanHtmlError) as error:
        render_plan_report(nodes_in)
    assert error.value.field == field
    with pytest.raises(AnsibleFilterError, match='kvpin_plan_report_html: %s' % field.replace('[', r'\[')):
        HTML_FILTER(nodes_in)


def test_hostile_sizes_are_bounded_or_refused():
    gpu = {'index': 0, 'name': 'x', 'memory_total': 24 << 30}
    # A megabyte-long name and model are cut to MAX_TEXT characters, escaped.
    long_name = '<' * (1 << 20)
    text = render_plan_report([{'host': 'n', 'gpus': [gpu], 'plans': [
        {'deployment': {'name': long_name, 'model': long_name}, 'failed': True, 'msg': long_name}]}])
    assert len(text) < 200000 and '&lt;' * 100 in text and '<<' not in text
    # A bool, a float or an absurd byte count is refused with its field, never drawn.
    for value in (True, 1.0, float('nan'), 1 << 60, '1'):
        with pytest.raises(PlanHtmlError) as error:
            render_plan_report([{'host': 'n', 'gpus': [gpu], 'ledger': {'gpus': [{'index': 0, 'card': 24 << 30,
                                                                                  'outside_processes': value}]}}])
        assert error.value.field == 'nodes[0].ledger.gpus[index 0].outside_processes'
    with pytest.raises(PlanHtmlError, match='limit 1024'):
        render_plan_report([{'host': 'n%d' % i, 'gpus': []} for i in range(1025)])
    with pytest.raises(PlanHtmlError, match=r'nodes\[0\].gpus: has 4097 items'):
        render_plan_report([{'host': 'n', 'gpus': [gpu] * 4097}])
