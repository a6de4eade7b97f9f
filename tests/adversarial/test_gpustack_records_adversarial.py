# -*- coding: utf-8 -*-
# Copyright: kvpin.fleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Records read back from a hostile GPUStack that echoes the API key into a field of the wrong
type: the error shows a sample of the field, cut to 60 characters. The modules mask the key
wherever it is whole (no_log values), so the cut must never leave a part of it."""

import pytest

from gpustack_attack import API_KEY, assert_no_secret

from ansible_collections.kvpin.fleet.plugins.module_utils.gpustack.records import (
    ServerRecordError, check_server_model, server_worker_labels,
)


@pytest.mark.parametrize('record,fields', [
    ({'env': ['x' * 30 + API_KEY]}, ['env']),                          # wrong type: a list
    ({'env': {'K': ['y' * 20 + API_KEY]}}, ['env']),                    # a value that is not a string
    ({'categories': 'z' * 10 + API_KEY + 'tail' * 20}, ['categories']),
    ({'backend_parameters': [1, '--api-key=' + API_KEY]}, ['backend_parameters']),
])
def test_a_cut_sample_of_a_model_record_holds_the_key_whole_or_not_at_all(record, fields):
    with pytest.raises(ServerRecordError) as error:
        check_server_model(record, fields)
    text = str(error.value).replace(API_KEY, '********')   # what the module's masking does
    assert_no_secret(text)


@pytest.mark.parametrize('labels', [['x' * 30 + API_KEY], {'a': 'b' * 25 + API_KEY, 'n': 1}])
def test_a_cut_sample_of_worker_labels_holds_the_key_whole_or_not_at_all(labels):
    with pytest.raises(ServerRecordError) as error:
        server_worker_labels({'name': 'w1', 'labels': labels})
    assert_no_secret(str(error.value).replace(API_KEY, '********'))
