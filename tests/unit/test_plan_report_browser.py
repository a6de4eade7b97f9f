# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The HTML plan report in a real browser: the distribution's Chromium (apt package chromium,
/usr/bin/chromium; scripts/bootstrap.sh installs it) driven by Playwright's Python API (pinned
in requirements.txt; never `playwright install`, which downloads a browser of its own).

The page (module_utils/plan_html.py over real plans, the real ledger, an XSS payload as a name)
opens from file://; it must draw one bar per GPU, every segment as long as its bytes at the
page's one scale (within 1 px of what Chromium lays out), log no console error, run no script
and request nothing but itself.

Also a tool: ``.venv/bin/python tests/unit/test_plan_report_browser.py REPORT.html SHOT.png``
checks a report playbooks/plan.yml wrote (the lab fleet's, for the README) the same way and
writes a full-page screenshot of it at a laptop's width.
"""
from __future__ import annotations

import os
import shutil
import sys

import pytest

CHROMIUM = os.environ.get('KVPIN_CHROMIUM', '/usr/bin/chromium')
LAPTOP = {'width': 1366, 'height': 768}

# For every bar: its GPU, card bytes and the laid-out box of each segment and of the card's end.
MEASURE = """() => {
  const main = document.querySelector('main');
  return {
    scale: parseFloat(main.dataset.bytesPerPx),
    pwned: window.kvpinPwned === undefined ? null : window.kvpinPwned,
    active: document.querySelectorAll('script, img, iframe, object, embed, link').length,
    bars: Array.from(document.querySelectorAll('g[data-gpu]')).map(g => {
      const end = g.querySelector('line.card-end').getBoundingClientRect();
      return {
        gpu: g.dataset.gpu, card: parseInt(g.dataset.cardBytes, 10), cardEnd: end.left + end.width / 2,
        segments: Array.from(g.querySelectorAll('rect[data-term]')).map(r => {
          const box = r.getBoundingClientRect();
          return {term: r.dataset.term, bytes: parseInt(r.dataset.bytes, 10), deployment: r.dataset.deployment || null,
                  left: box.left, width: box.width, height: box.height};
        }),
      };
    }),
  };
}"""


# Readability at fleet scale: the page's width against the viewport, and per bar the box of
# its label and of its first segment (the label must end before the bar starts, and no two
# bars' rows may overlap).
MEASURE_READABLE = """() => ({
  viewport: window.innerWidth,
  scrollWidth: document.documentElement.scrollWidth,
  scrollHeight: document.documentElement.scrollHeight,
  rows: Array.from(document.querySelectorAll('g[data-gpu]')).map(g => {
    const label = g.querySelector('text.label').getBoundingClientRect();
    const first = g.querySelector('rect[data-term]').getBoundingClientRect();
    const row = g.getBoundingClientRect();
    return {gpu: g.dataset.gpu, labelRight: label.right, labelTop: label.top + window.scrollY,
            labelBottom: label.bottom + window.scrollY, barLeft: first.left,
            top: row.top + window.scrollY, bottom: row.bottom + window.scrollY};
  }),
})"""


def check_readable(readable):
    """The page is no wider than the window (no sideways scrolling), every label ends before
    its bar starts, and the bars' rows (label and bar) do not overlap one another."""
    assert readable['scrollWidth'] <= readable['viewport'], readable['scrollWidth']
    rows = sorted(readable['rows'], key=lambda row: row['top'])
    for row in rows:
        assert row['labelRight'] <= row['barLeft'] + 0.5, row
    for above, below in zip(rows, rows[1:]):
        assert above['bottom'] <= below['top'] + 0.5, (above, below)
        assert above['labelBottom'] <= below['labelTop'] + 0.5, (above, below)


def open_report(path, screenshot=None, readable=None):
    """Open ``path`` in Chromium: (measurements, console errors, page errors, requests);
    ``readable``, a dict, receives MEASURE_READABLE's figures."""
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel
    url = 'file://' + os.path.abspath(path)
    errors, page_errors, requests = [], [], []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.on('console', lambda msg: errors.append(msg.text) if msg.type == 'error' else None)
            page.on('pageerror', lambda exc: page_errors.append(str(exc)))
            page.on('request', lambda request: requests.append(request.url))
            page.goto(url, wait_until='load')
            measured = page.evaluate(MEASURE)
            if readable is not None:
                readable.update(page.evaluate(MEASURE_READABLE))
            if screenshot:
                page.screenshot(path=screenshot, full_page=True)
        finally:
            browser.close()
    return measured, errors, page_errors, [u for u in requests if u != url]


def check_layout(measured):
    """Every segment as long as its bytes at the page's scale (1 px), the segments one after
    another from the bar's start, the card's end mark at the card's bytes."""
    scale = measured['scale']
    assert scale > 0
    for gpu_bar in measured['bars']:
        assert gpu_bar['segments'], gpu_bar['gpu']
        start = gpu_bar['segments'][0]['left']
        position = start
        for segment in gpu_bar['segments']:
            assert abs(segment['width'] - segment['bytes'] / scale) <= 1, (gpu_bar['gpu'], segment)
            assert abs(segment['left'] - position) <= 1, (gpu_bar['gpu'], segment)
            assert segment['height'] > 0
            position = segment['left'] + segment['width']
        assert abs(gpu_bar['cardEnd'] - (start + gpu_bar['card'] / scale)) <= 1, gpu_bar['gpu']


@pytest.fixture(scope='module')
def browser_ready():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip('%s missing: apt-get install chromium (scripts/bootstrap.sh does)' % CHROMIUM)
    try:
        import playwright.sync_api  # noqa: F401 pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        pytest.skip('playwright missing: pip install -r requirements.txt (scripts/bootstrap.sh does)')


def test_the_report_in_chromium_one_bar_per_gpu_segments_to_scale_no_error(browser_ready, tmp_path):
    from plan_report_nodes import fleet  # pylint: disable=import-outside-toplevel

    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import render_plan_report
    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import RESIDENT_TERMS
    nodes = fleet()
    report = tmp_path / 'kvpin-plan-report.html'
    report.write_text(render_plan_report(nodes), encoding='utf-8')
    measured, errors, page_errors, requests = open_report(str(report))
    assert [gpu_bar['gpu'] for gpu_bar in measured['bars']] == [
        '%s:%d' % (node['host'], gpu['index']) for node in nodes for gpu in node['gpus']]
    check_layout(measured)
    # The laid-out segments are the plans' bytes: every term of every deployed plan on each of its
    # GPUs (the XSS payload read back as its name), and nothing of the infeasible plan.
    bars = dict((b['gpu'], b) for b in measured['bars'])
    drawn = 0
    for node in nodes:
        for result in node['plans']:
            plan, name = result['plan'], result['deployment']['name']
            for row in plan['memory']:
                laid_out = [s for s in bars['%s:%d' % (node['host'], row['index'])]['segments'] if s['deployment'] == name]
                if not plan['feasible']:
                    assert laid_out == []
                    continue
                want = [(t, row[t]) for t in RESIDENT_TERMS] + [('cuda_context', row['terms']['outside_cuda_context'])] + [
                    ('cold_compile_margin', row['terms'][t]) for t in ('cold_compile_margin',) if row['terms'].get(t)]
                assert [(s['term'], s['bytes']) for s in laid_out] == want
                for segment in laid_out:
                    assert abs(segment['width'] - segment['bytes'] / measured['scale']) <= 1
                drawn += 1
    assert drawn == 6      # chat, the payload, tp2 on two GPUs, a, b
    assert errors == [] and page_errors == []
    # The payload stayed text: no script ran, no element it names exists, nothing was fetched.
    assert measured['pwned'] is None and measured['active'] == 0
    assert requests == []


def test_the_laid_out_check_catches_a_segment_drawn_off_scale(browser_ready, tmp_path):
    """The measurement is not vacuous: a page whose rect is 3 px longer than its bytes fails."""
    from plan_report_nodes import fleet  # pylint: disable=import-outside-toplevel

    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import render_plan_report
    text = render_plan_report(fleet()[2:])
    start = text.index('<rect data-term="headroom"')
    width_at = text.index('width="', start) + len('width="')
    width_end = text.index('"', width_at)
    text = text[:width_at] + '%.3f' % (float(text[width_at:width_end]) + 3) + text[width_end:]
    report = tmp_path / 'off-scale.html'
    report.write_text(text, encoding='utf-8')
    measured, _errors, _page_errors, _requests = open_report(str(report))
    with pytest.raises(AssertionError):
        check_layout(measured)


def test_a_100_node_report_stays_readable_one_bar_per_gpu(browser_ready, tmp_path):
    """100 nodes (the test fleet's three, repeated under new names: real plans, real ledgers):
    one bar per GPU, all at the one scale, as wide as the window at most, no label over its
    bar or over another row."""
    from plan_report_nodes import many_nodes  # pylint: disable=import-outside-toplevel

    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import render_plan_report
    nodes = many_nodes(100)
    report = tmp_path / 'fleet-100.html'
    report.write_text(render_plan_report(nodes), encoding='utf-8')
    readable = {}
    measured, errors, page_errors, requests = open_report(str(report), readable=readable)
    assert [gpu_bar['gpu'] for gpu_bar in measured['bars']] == [
        '%s:%d' % (node['host'], gpu['index']) for node in nodes for gpu in node['gpus']]
    check_layout(measured)
    check_readable(readable)
    assert errors == [] and page_errors == [] and requests == []


def test_the_readable_check_catches_a_label_over_its_bar(browser_ready, tmp_path):
    """Not vacuous: a label pushed 200 px right runs into its bar and fails the check."""
    from plan_report_nodes import fleet  # pylint: disable=import-outside-toplevel

    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import render_plan_report
    text = render_plan_report(fleet()[2:]).replace('<text x="0" ', '<text x="200" ', 1)
    report = tmp_path / 'label-over-bar.html'
    report.write_text(text, encoding='utf-8')
    readable = {}
    open_report(str(report), readable=readable)
    with pytest.raises(AssertionError):
        check_readable(readable)


# The measured-vs-declared and planned-vs-actual KV tables of each deployment, as laid out.
MEASURE_MEASURED = """() => Array.from(document.querySelectorAll('details.deployment')).map(d => {
  d.open = true;
  const rows = Array.from(d.querySelectorAll('table.traffic tr[data-figure]'));
  const kv = d.querySelector('table.kv-pool');
  const visible = el => { const b = el.getBoundingClientRect(); return b.width > 0 && b.height > 0; };
  return {
    figures: rows.map(r => ({figure: r.dataset.figure, declared: r.querySelector('td.declared').textContent,
                             measured: r.querySelector('td.measured').textContent,
                             used: r.querySelector('td.used').textContent,
                             drift: r.querySelector('td.drift').textContent, visible: visible(r)})),
    kv: kv ? {planned: kv.querySelector('td.planned').textContent, actual: kv.querySelector('td.actual').textContent,
              drift: kv.querySelector('td.drift').textContent, flagged: kv.classList.contains('bad'),
              visible: visible(kv)} : null,
  };
})"""


def test_the_report_shows_measured_vs_declared_traffic_and_planned_vs_actual_kv(browser_ready, tmp_path):
    from plan_report_nodes import a6000, node, result  # pylint: disable=import-outside-toplevel
    from playwright.sync_api import sync_playwright  # pylint: disable=import-outside-toplevel

    from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_html import render_plan_report
    gpus = [a6000(0)]
    declared = result('chat', gpus)
    actual = declared['plan']['kv_cache_tokens'] // 2
    measurement = dict(traffic=dict(requests=1200, prompt_tokens_p99_lower=1552, prompt_tokens_p99_upper=1707,
                                    generation_tokens_p99_lower=465, generation_tokens_p99_upper=512,
                                    max_concurrency=11),
                       kv_pool=dict(kv_cache_tokens=actual), gpu='NVIDIA RTX A6000', backend_version='0.10.1.1',
                       args=declared['plan']['args'])
    nodes = [node('node-1', gpus, [result('chat', gpus, measurement=measurement), result('plain', gpus)])]
    report = tmp_path / 'measured.html'
    report.write_text(render_plan_report(nodes), encoding='utf-8')
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            page = browser.new_page(viewport=LAPTOP)
            page.goto('file://' + str(report), wait_until='load')
            shown = page.evaluate(MEASURE_MEASURED)
        finally:
            browser.close()
    chat, plain = shown
    assert [(f['figure'], f['declared'], f['measured'], f['used']) for f in chat['figures']] == [
        ('prompt', '4096', '1707', '4096'), ('output', '512', '512', '512'), ('concurrency', '8', '11', '8')]
    assert all(f['visible'] for f in chat['figures'])
    assert chat['figures'][0]['drift'] == 'measured below declared'
    assert chat['figures'][2]['drift'] == 'measured above declared'
    assert chat['kv'] == {'planned': str(declared['plan']['kv_cache_tokens']), 'actual': str(actual),
                          'drift': '-50.0 %', 'flagged': True, 'visible': True}
    assert plain == {'figures': [], 'kv': None}


def main(argv):
    """Check a report written by playbooks/plan.yml and write its screenshot."""
    if len(argv) != 3:
        sys.stderr.write('usage: %s REPORT.html SCREENSHOT.png\n' % argv[0])
        return 2
    if shutil.which(CHROMIUM) is None:
        sys.stderr.write('%s missing: apt-get install chromium\n' % CHROMIUM)
        return 1
    readable = {}
    measured, errors, page_errors, requests = open_report(argv[1], screenshot=argv[2], readable=readable)
    check_layout(measured)
    check_readable(readable)
    if errors or page_errors or requests:
        sys.stderr.write('console errors %s, page errors %s, requests %s\n' % (errors, page_errors, requests))
        return 1
    print('%d GPU bars to scale, no console error; screenshot %s' % (len(measured['bars']), argv[2]))
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
