"""load_model on a folder that is not a model says what the folder lacks, not a tokenizer error."""
import re

import pytest

from decodelab.models.load import load_model


def test_an_empty_folder_is_named_with_what_a_model_folder_holds(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(
            f"model folder {str(tmp_path)!r} has no config.json and no weights (*.safetensors or pytorch_model*.bin) "
            "and no tokenizer files (tokenizer.json, tokenizer_config.json, ...); a model folder holds config.json, "
            "the weights")):
        load_model(str(tmp_path), device="cpu")


def test_a_folder_without_weights_names_only_them(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=re.escape("has no weights (*.safetensors or pytorch_model*.bin);")):
        load_model(str(tmp_path), device="cpu")
