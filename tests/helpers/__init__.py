"""Helpers shared by the test folders (importable as `helpers.*`: pyproject's [tool.pytest.ini_options] puts
tests/ and src/ on sys.path). tiny_models: the one builder of tiny random transformers models; tiny_hf: tiny model
directories with a chat tokenizer, chat JSONL data and small-run overrides."""
