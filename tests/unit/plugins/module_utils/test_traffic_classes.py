"""serving_plan with traffic_classes: the strategy (single / scheduled / none), every profile
planned by the engine's own planner, the split alternative's cost, and bad input refused by name.

The planners are the real ones (vllm_memory, llamacpp_memory) on catalog models: nothing inside
the logic under test is replaced."""
import pytest

from ansible_collections.kvpin.fleet.plugins.module_utils.plan import traffic_classes as tc
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.plan_types import PlanInputError
from ansible_collections.kvpin.fleet.plugins.module_utils.plan.serving_plan import (
    SERVING_PLAN_ARGUMENT_SPEC, build_plan, plan_report, serving_plan_result)

A6000 = {'name': 'NVIDIA RTX A6000', 'memory_total': 51527024640, 'memory_used': 0,
         'memory_free': 51527024640, 'compute_capability': '8.6'}
LLAMA_70B = 'meta-llama/Llama-3.3-70B-Instruct'
CHAT = dict(name='chat', prompt_tokens_p99=2048, max_output_tokens=512, max_concurrency=64, hours='07:00-23:00')
BATCH = dict(name='batch', prompt_tokens_p99=30000, max_output_tokens=2048, max_concurrency=4, hours='00:00-06:00')


def a6000s(count):
    return [dict(A6000, index=i, uuid='GPU-%d' % i) for i in range(count)]


def params(classes, **changes):
    base = dict((name, spec.get('default')) for name, spec in SERVING_PLAN_ARGUMENT_SPEC.items())
    # the field report's team consented to fp8 KV (allow_fp8_kv) after their eval
    base.update(backend='vllm', backend_version='0.10.1.1', model=LLAMA_70B, gpus=a6000s(4),
                tensor_parallel_size=4, traffic_classes=classes, allow_fp8_kv=True)
    base.update(changes)
    return base


def alternative(plan, strategy):
    return [a for a in plan['alternatives'] if a['strategy'] == strategy][0]


def one_copy(profile):
    return sum(row['weights'] for row in profile['memory_per_gpu'])


def assert_profile_holds(profile):
    assert profile['feasible'], profile['not_fitting']
    for row in profile['memory_per_gpu']:
        assert row['resident'] == (row['weights'] + row['activation'] + row['non_torch'] + row['cuda_graph']
                                   + row['kv_cache'])
        assert row['resident'] <= row['total'], row
    assert profile['kv_cache_tokens'] >= profile['demand_tokens'] > 0
    assert profile['settings']['max_num_seqs'] >= profile['demand_sequences']
    assert profile['args'] and all(arg.startswith('--') for arg in profile['args'])
    for key in ('traffic', 'kv_pool', 'max_model_len', 'activation', 'max_num_seqs'):
        assert profile['reasons'][key], key


# ---------------------------------------------------------------- the field report's dilemma
@pytest.fixture(scope='module')
def dilemma():
    return serving_plan_result(params([CHAT, BATCH]))


def test_dilemma_is_served_with_the_weights_once(dilemma):
    assert not dilemma.get('failed'), dilemma.get('msg')
    plan = dilemma['plan']
    assert plan['strategy'] in ('single', 'scheduled')
    assert plan['feasible']
    chosen = alternative(plan, plan['strategy'])
    assert chosen['feasible'] and chosen['weight_copies'] == 1
    assert chosen['weights_bytes'] == max(one_copy(p) for p in plan['profiles'])
    for profile in plan['profiles']:
        assert_profile_holds(profile)
        # the same weights on the same four GPUs in every profile
        assert profile['settings']['tensor_parallel_size'] == 4
        assert [row['index'] for row in profile['memory_per_gpu']] == [0, 1, 2, 3]
        assert one_copy(profile) == chosen['weights_bytes']


def test_dilemma_single_profile_is_sized_by_the_longest_class_and_the_busiest_window(dilemma):
    plan = dilemma['plan']
    assert plan['strategy'] == 'single'     # fp8 KV holds 64 chat sequences and 32k batch prompts
    (profile,) = plan['profiles']
    assert profile['classes'] == ['chat', 'batch']
    assert profile['settings']['max_model_len'] == 32768                    # 30000 + 2048 -> 32768
    assert profile['demand_sequences'] == 64                                 # chat alone at 07:00-23:00
    assert profile['demand_tokens'] == 64 * 2560                            # > 4 x 32048 of the batch
    # a 30k prompt cannot blow the activation peak: chunked prefill with a pinned batch
    assert profile['settings']['enable_chunked_prefill'] is True
    assert profile['settings']['max_num_batched_tokens'] < BATCH['prompt_tokens_p99']
    assert '--max-model-len=32768' in profile['args'] and '--max-num-seqs=64' in profile['args']
    assert plan['args'] == profile['args'] and plan['schedule'] == []
    assert plan['reasons']['strategy'].startswith('single: one configuration holds every window')


def test_dilemma_reports_what_the_split_would_cost(dilemma):
    plan = dilemma['plan']
    split = alternative(plan, 'split')
    once = alternative(plan, 'single')['weights_bytes']
    assert split['weight_copies'] == 2
    # each deployment holds a whole copy (TP=2 on its half: replicated parts differ by a few MB from TP=4)
    assert split['weights_bytes'] == sum(one_copy(d) for d in split['deployments'])
    for deployment in split['deployments']:
        assert abs(one_copy(deployment) - once) < once // 1000
    # 70B bf16 on two 48 GB cards per deployment does not even hold the weights
    assert not split['feasible']
    assert [d['gpus'] for d in split['deployments']] == [[0, 1], [2, 3]]
    assert [d['classes'] for d in split['deployments']] == [['batch'], ['chat']]
    assert all('exceed the budget' in ' '.join(d['not_fitting']) for d in split['deployments'])
    report = '\n'.join(dilemma['plan_report'])
    assert '%d B' % split['weights_bytes'] in report and 'hold the weights twice' in report
    assert 'split      no                    2' in report


def test_dilemma_at_the_field_reports_utilization_is_still_single(dilemma):
    """The field report pinned gpu_memory_utilization 0.88 under TP 4 (0.92 crashed)."""
    result = serving_plan_result(params([CHAT, BATCH], gpu_memory_utilization=0.88))
    plan = result['plan']
    assert plan['strategy'] == 'single', result.get('msg')
    (profile,) = plan['profiles']
    assert_profile_holds(profile)
    assert '--gpu-memory-utilization=0.88' in profile['args']
    # a smaller budget than the derived 0.89: less KV, still more than the busiest window needs
    assert profile['kv_cache_tokens'] < dilemma['plan']['profiles'][0]['kv_cache_tokens']


# ---------------------------------------------------------------- scheduled
def test_scheduled_when_one_configuration_cannot_hold_the_night_batch():
    # 7 x 29856 tokens (whole blocks): above what one configuration holds, within the batch profile's pool once
    # the cold-compile margin of a vLLM without --kv-cache-memory-bytes (0.10.1.1) is charged
    batch = dict(BATCH, prompt_tokens_p99=27800, max_concurrency=7, hours='23:00-07:00')
    result = serving_plan_result(params([CHAT, batch], kv_cache_dtype='fp8'))
    assert not result.get('failed'), result.get('msg')
    plan = result['plan']
    assert plan['strategy'] == 'scheduled'
    single = alternative(plan, 'single')
    # compared in KV blocks (the engine's unit): 13062 blocks = 208992 tokens / 16
    assert not single['feasible'] and '< 13062 needed by the busiest window' in single['reason']
    assert [p['name'] for p in plan['profiles']] == ['batch', 'chat']
    assert plan['schedule'] == [dict(at='07:00', profile='chat'), dict(at='23:00', profile='batch')]
    assert alternative(plan, 'scheduled')['switches_per_day'] == 2
    for profile in plan['profiles']:
        assert_profile_holds(profile)
        assert profile['settings']['tensor_parallel_size'] == 4
        # the planner's GPU choice of the single configuration, pinned for every profile
        assert profile['reasons']['gpu_indexes'].startswith("[0, 1, 2, 3]: the single configuration's GPU choice")
    batch_profile, chat_profile = plan['profiles']
    assert one_copy(batch_profile) == one_copy(chat_profile)               # weights once, same layout
    assert batch_profile['hours'] == ['23:00-07:00'] and chat_profile['hours'] == ['07:00-23:00']
    assert batch_profile['demand_tokens'] == 7 * 29856     # whole 16-token blocks per sequence
    assert batch_profile['settings']['max_model_len'] == 32768
    assert chat_profile['settings']['max_model_len'] == 4096
    assert plan['vram_claim_bytes'] == max(p['vram_claim_bytes'] for p in plan['profiles'])
    assert 'switch at 07:00 to profile chat' in result['plan_report']


def test_scheduled_profiles_keep_the_single_configurations_tp_under_auto():
    """TP auto would give a 2.5k-token chat profile TP 1 and the 64k batch TP 2 on two 4090s:
    different weights. Every profile takes the single configuration's TP instead."""
    rtx4090 = dict(A6000, name='NVIDIA GeForce RTX 4090', memory_total=25757220864, memory_free=25757220864,
                   compute_capability='8.9')
    chat = dict(CHAT, max_concurrency=8)
    batch = dict(BATCH, prompt_tokens_p99=60000, max_output_tokens=4000, max_concurrency=2, hours='23:00-07:00')
    result = serving_plan_result(params([chat, batch], model='meta-llama/Llama-3.1-8B-Instruct',
                                        tensor_parallel_size='auto', kv_cache_dtype='auto',
                                        gpus=[dict(rtx4090, index=i) for i in range(2)]))
    plan = result['plan']
    assert plan['profiles'][0]['settings']['tensor_parallel_size'] == 2
    scheduled = alternative(plan, 'scheduled')
    assert scheduled['feasible'] and scheduled['profiles'] == ['batch', 'chat']
    assert 'tensor_parallel_size=2' in scheduled['reason']
    for args in scheduled['profile_args'].values():
        assert '--tensor-parallel-size=2' in args
    alone = serving_plan_result(params([chat], model='meta-llama/Llama-3.1-8B-Instruct', tensor_parallel_size='auto',
                                       kv_cache_dtype='auto', gpus=[dict(rtx4090, index=i) for i in range(2)]))
    assert alone['plan']['profiles'][0]['settings']['tensor_parallel_size'] == 1     # what auto alone picks


def test_llama_box_schedules_slots_per_window():
    """llama.cpp slots are ctx_size / parallel each: one configuration would give all ten slots
    32k tokens; the two windows each get their own."""
    chat = dict(CHAT, max_concurrency=8, hours='07:00-22:00')
    batch = dict(BATCH, max_concurrency=2, hours='23:00-06:00')
    result = serving_plan_result(params([chat, batch], backend='llama-box', backend_version='v0.0.171',
                                        tensor_parallel_size=None, allow_fp8_kv=None, quantization='Q4_K_M'))
    assert not result.get('failed'), result.get('msg')
    plan = result['plan']
    assert plan['strategy'] == 'scheduled'
    single = alternative(plan, 'single')
    assert not single['feasible']
    chat_profile = [p for p in plan['profiles'] if p['name'] == 'chat'][0]
    batch_profile = [p for p in plan['profiles'] if p['name'] == 'batch'][0]
    assert chat_profile['settings']['parallel'] == 8 and chat_profile['settings']['ctx_size'] == 8 * 2560
    assert batch_profile['settings']['parallel'] == 2 and batch_profile['settings']['ctx_size'] == 2 * 32048
    for profile in plan['profiles']:
        assert profile['feasible'] and profile['kv_cache_tokens'] >= profile['demand_tokens']


# ---------------------------------------------------------------- single suffices / nothing fits
def test_single_suffices_and_overlapping_classes_add_up():
    office = dict(name='office', prompt_tokens_p99=4000, max_output_tokens=1000, max_concurrency=8,
                  hours='09:00-17:00')
    always = dict(name='api', prompt_tokens_p99=1000, max_output_tokens=500, max_concurrency=16)
    result = serving_plan_result(params([always, office], model='meta-llama/Llama-3.1-8B-Instruct',
                                        gpus=a6000s(1), tensor_parallel_size=None))
    assert not result.get('failed'), result.get('msg')
    plan = result['plan']
    assert plan['strategy'] == 'single'
    (profile,) = plan['profiles']
    assert_profile_holds(profile)
    assert profile['demand_sequences'] == 24                                # both at 09:00-17:00
    assert profile['demand_tokens'] == 16 * 1504 + 8 * 5008                 # rounded to 16-token blocks
    assert profile['settings']['max_model_len'] == 8192
    # the scheduled alternative was planned too (api alone / api+office) and is not cheaper
    scheduled = alternative(plan, 'scheduled')
    assert scheduled['feasible'] and scheduled['profiles'] == ['api', 'api+office']
    assert scheduled['switches_per_day'] == 2
    assert plan['traffic_classes'][0]['hours'] == 'always'


def test_nothing_fits_and_every_profile_says_why():
    result = serving_plan_result(params([CHAT, BATCH], gpus=a6000s(2), tensor_parallel_size=2))
    assert result['failed'] and result['msg'].startswith('no strategy serves every traffic class')
    plan = result['plan']
    assert plan['strategy'] == 'none' and not plan['feasible']
    assert [p['name'] for p in plan['profiles']] == ['single', 'batch', 'chat']
    for profile in plan['profiles']:
        assert not profile['feasible']
        assert any('exceed the budget' in text for text in profile['not_fitting']), profile['not_fitting']
        assert profile['demand_tokens'] > profile['kv_cache_tokens']
    assert [a['feasible'] for a in plan['alternatives']] == [False, False, False]
    assert plan['not_fitting'][0].startswith('single: ')
    relaxed = serving_plan_result(params([CHAT, BATCH], gpus=a6000s(2), tensor_parallel_size=2,
                                         fail_on_infeasible=False))
    assert not relaxed.get('failed') and relaxed['plan']['strategy'] == 'none'


# ---------------------------------------------------------------- time windows
def test_windows_cross_midnight_and_merge_around_it():
    classes = tc.parse_traffic_classes([
        dict(name='night', prompt_tokens_p99=100, max_output_tokens=10, max_concurrency=1, hours='22:00-06:00'),
        dict(name='day', prompt_tokens_p99=100, max_output_tokens=10, max_concurrency=2, hours='05:30-22:00')])
    windows = tc.time_windows(classes)
    assert [(tc.window_text(w), w[2]) for w in windows] == [
        ('22:00-05:30', ('night',)), ('05:30-06:00', ('night', 'day')), ('06:00-22:00', ('day',))]
    assert tc.demand(classes) == (3, 330)


def test_full_day_and_unset_hours_are_always():
    classes = tc.parse_traffic_classes([
        dict(name='a', prompt_tokens_p99=1, max_output_tokens=1, max_concurrency=1, hours='00:00-24:00'),
        dict(name='b', prompt_tokens_p99=1, max_output_tokens=1, max_concurrency=1)])
    assert [(tc.window_text(w), w[2]) for w in tc.time_windows(classes)] == [('always', ('a', 'b'))]


def test_schedule_edges_keep_the_profile_through_idle_windows():
    classes = tc.parse_traffic_classes([
        dict(name='chat', prompt_tokens_p99=1, max_output_tokens=1, max_concurrency=1, hours='07:00-23:00'),
        dict(name='batch', prompt_tokens_p99=1, max_output_tokens=1, max_concurrency=1, hours='00:00-06:00')])
    windows = tc.time_windows(classes)
    assert [w[2] for w in windows] == [('batch',), (), ('chat',), ()]
    edges = tc.schedule_edges(windows, {('chat',): 'chat', ('batch',): 'batch'})
    assert edges == [dict(at='00:00', profile='batch'), dict(at='07:00', profile='chat')]


# ---------------------------------------------------------------- single class unchanged
def test_single_class_input_keeps_todays_output():
    single = params(None, prompt_tokens_p99=11000, max_output_tokens=1024, max_concurrency=32)
    result = serving_plan_result(single)
    plan = build_plan(single)
    assert result == dict(changed=False, plan=plan.to_dict(), plan_report=plan_report(plan))
    for key in ('strategy', 'profiles', 'schedule', 'alternatives', 'traffic_classes'):
        assert key not in result['plan']


# ---------------------------------------------------------------- bad input
def _cls(**changes):
    entry = dict(name='c', prompt_tokens_p99=100, max_output_tokens=10, max_concurrency=1)
    entry.update(changes)
    return entry


@pytest.mark.parametrize('classes, extra, field, text', [
    ('chat', {}, 'traffic_classes', 'must be a list'),
    ({'name': 'chat'}, {}, 'traffic_classes', 'must be a list'),
    ([], {}, 'traffic_classes', 'is empty'),
    ([_cls(name='c%d' % i) for i in range(17)], {}, 'traffic_classes', 'at most 16'),
    (['chat'], {}, 'traffic_classes[0]', 'must be a dict'),
    ([_cls(prio=1)], {}, 'traffic_classes[0]', 'unknown key(s) prio'),
    ([{'name': 'c', 'prompt_tokens_p99': 1}], {}, 'traffic_classes[0]', 'missing max_output_tokens, max_concurrency'),
    ([_cls(name='')], {}, 'traffic_classes[0].name', "got ''"),
    ([_cls(name=7)], {}, 'traffic_classes[0].name', 'got 7'),
    ([_cls(name='a b')], {}, 'traffic_classes[0].name', "got 'a b'"),
    ([_cls(name='x' * 65)], {}, 'traffic_classes[0].name', '1 to 64 characters'),
    ([_cls(), _cls()], {}, 'traffic_classes[1].name', "'c' names two classes"),
    ([_cls(prompt_tokens_p99=0)], {}, 'traffic_classes[0].prompt_tokens_p99', 'must be > 0, got 0'),
    ([_cls(prompt_tokens_p99=-5)], {}, 'traffic_classes[0].prompt_tokens_p99', 'must be > 0, got -5'),
    ([_cls(max_output_tokens=10 ** 9)], {}, 'traffic_classes[0].max_output_tokens', 'got 1000000000'),
    ([_cls(max_concurrency=True)], {}, 'traffic_classes[0].max_concurrency', 'True'),
    ([_cls(max_concurrency=2.5)], {}, 'traffic_classes[0].max_concurrency', 'whole number'),
    ([_cls(max_concurrency=float('nan'))], {}, 'traffic_classes[0].max_concurrency', 'nan'),
    ([_cls(max_concurrency='many')], {}, 'traffic_classes[0].max_concurrency', "'many'"),
    ([_cls(name='a', max_concurrency=60000), _cls(name='b', max_concurrency=60000)], {},
     'traffic_classes', 'adds up to 120000'),
    ([_cls(hours=700)], {}, 'traffic_classes[0].hours', 'got 700 (int)'),
    ([_cls(hours='7-23')], {}, 'traffic_classes[0].hours', "got '7-23'"),
    ([_cls(hours='07:00 - 23:00')], {}, 'traffic_classes[0].hours', 'HH:MM-HH:MM'),
    ([_cls(hours='07:00-23:00\nx')], {}, 'traffic_classes[0].hours', 'HH:MM-HH:MM'),
    ([_cls(hours='25:00-01:00')], {}, 'traffic_classes[0].hours', "'25:00-01:00' is not a time of day"),
    ([_cls(hours='07:60-08:00')], {}, 'traffic_classes[0].hours', 'not a time of day'),
    ([_cls(hours='24:00-06:00')], {}, 'traffic_classes[0].hours', '24:00 only as an end'),
    ([_cls(hours='06:00-24:30')], {}, 'traffic_classes[0].hours', 'not a time of day'),
    ([_cls(hours='07:00-07:00')], {}, 'traffic_classes[0].hours', 'empty window'),
    ([_cls()], dict(prompt_tokens_p99=100), 'traffic_classes', 'got both traffic_classes and prompt_tokens_p99=100'),
    ([_cls()], dict(max_concurrency=4), 'traffic_classes', 'max_concurrency=4'),
    ([_cls()], dict(model=''), 'model', 'required'),
    ([_cls()], dict(gpus=[]), 'gpus', 'no GPUs given'),
    ([_cls()], dict(gpu_layers=60), 'gpu_layers', 'backend vllm does not take it'),
    ([_cls()], dict(max_model_len='long'), 'max_model_len', "got 'long'"),
    ([_cls()], dict(backend='llama-box', tensor_parallel_size=None, max_model_len=4096), 'max_model_len', 'vLLM option'),
    ([_cls()], dict(backend='tgi'), 'backend', "got 'tgi'"),
    ([_cls()], dict(backend=None), 'backend', 'got None'),
    ([_cls()], dict(backend_version=''), 'backend_version', 'required'),
    ([_cls()], dict(tensor_parallel_size=3), 'tensor_parallel_size', '3'),
])
def test_bad_traffic_classes_are_refused_by_name(classes, extra, field, text):
    result = serving_plan_result(params(classes, **extra))
    assert result['failed'] and result['field'] == field, result
    assert text in result['msg'], result['msg']
    assert 'plan' not in result


def test_neither_single_class_options_nor_classes_is_refused():
    result = serving_plan_result(params(None))
    assert result['failed'] and result['field'] == 'prompt_tokens_p99'
    assert 'unless traffic_classes is given' in result['msg']


def test_parse_refuses_before_any_planning():
    with pytest.raises(PlanInputError) as raised:
        tc.plan_traffic_classes(params([_cls(hours='99:99-00:00')]), build_plan, resolve_model=pytest.fail)
    assert raised.value.field == 'traffic_classes[0].hours'


def test_dilemma_without_fp8_kv_fits_no_strategy():
    """With the model dtype's KV cache, 64 chat sequences alone need more than bf16 leaves."""
    result = serving_plan_result(params([CHAT, BATCH], kv_cache_dtype='auto', fail_on_infeasible=False))
    plan = result['plan']
    assert plan['strategy'] == 'none' and not plan['feasible']
    single = plan['profiles'][0]
    assert single['name'] == 'single' and single['kv_cache_tokens'] < single['demand_tokens'] == 163840
    # compared in KV blocks (the engine's unit): 10240 blocks = 163840 tokens / 16
    assert single['demand_blocks'] == 10240 > single['kv_cache_blocks']
    assert '< 10240 needed by the busiest window' in ' '.join(single['not_fitting'])
    assert '< 64 sequences' in ' '.join(single['not_fitting'])


# ---------------------------------------------------------------- random classes: the rule holds
def _random_classes(rng):
    classes = []
    for position in range(rng.randint(1, 4)):
        entry = dict(name='c%d' % position, prompt_tokens_p99=rng.choice((100, 2000, 8000, 30000)),
                     max_output_tokens=rng.choice((64, 512, 2048)), max_concurrency=rng.choice((1, 4, 16, 64)))
        if rng.random() < 0.8:
            start, length = rng.randrange(0, 1440, 30), rng.randrange(30, 1440, 30)
            end = (start + length) % 1440
            entry['hours'] = '%02d:%02d-%02d:%02d' % (start // 60, start % 60, end // 60, end % 60)
        classes.append(entry)
    return classes


@pytest.mark.parametrize('seed', range(12))
def test_random_classes_follow_the_cheapest_rule(seed):
    import random
    rng = random.Random(seed)
    classes = _random_classes(rng)
    result = serving_plan_result(params(classes, fail_on_infeasible=False,
                                        model=rng.choice((LLAMA_70B, 'meta-llama/Llama-3.1-8B-Instruct')),
                                        gpus=a6000s(rng.choice((1, 2, 4))), tensor_parallel_size=None))
    assert 'plan' in result, result.get('msg')
    plan = result['plan']
    single, scheduled, split = plan['alternatives']
    assert split['weight_copies'] == 2 and single['weight_copies'] == scheduled['weight_copies'] == 1
    if single['feasible']:
        assert plan['strategy'] == 'single'
    elif scheduled['feasible']:
        assert plan['strategy'] == 'scheduled' and len(plan['schedule']) >= 2
    else:
        assert plan['strategy'] == 'none' and not plan['feasible']
    if plan['strategy'] == 'none':
        return
    for profile in plan['profiles']:
        assert_profile_holds(profile)
    # every window with a class in it is served by a profile sized for all of that window's classes
    for window in tc.time_windows(tc.parse_traffic_classes(classes)):
        if window[2]:
            serving = [p for p in plan['profiles'] if tc.window_text(window) in p['hours']]
            assert len(serving) == 1 and set(window[2]) <= set(serving[0]['classes']), (window, plan['profiles'])


def test_scheduled_profiles_keep_the_single_configurations_gpu_choice():
    """On a mixed node the planner chooses the GPUs (gpu_choice); every scheduled profile is
    pinned to the single configuration's choice, so the weights stay on the same card."""
    rtx4090 = dict(A6000, name='NVIDIA GeForce RTX 4090', memory_total=25757220864, memory_free=25757220864,
                   compute_capability='8.9')
    chat = dict(CHAT, max_concurrency=8)
    batch = dict(BATCH, prompt_tokens_p99=60000, max_output_tokens=4000, max_concurrency=2, hours='23:00-07:00')
    result = serving_plan_result(params([chat, batch], model='meta-llama/Llama-3.1-8B-Instruct',
                                        tensor_parallel_size=1, kv_cache_dtype='auto',
                                        gpus=[dict(rtx4090, index=0), dict(A6000, index=1, uuid='GPU-1')]))
    assert not result.get('failed'), result.get('msg')
    plan = result['plan']
    scheduled = alternative(plan, 'scheduled')
    assert scheduled['feasible']
    chosen = plan['gpu_indexes']
    assert chosen == [1]                      # the A6000: the larger KV pool of the two single cards
    for profile in plan['profiles']:
        assert [gpu['index'] for gpu in profile['memory_per_gpu']] == chosen
