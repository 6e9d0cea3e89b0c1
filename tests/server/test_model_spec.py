"""ModelSpec from the serve command line and from models.toml: names derived or given, keys checked
with the allowed values in the message; ServerConfig refuses chips that do not exist."""

from __future__ import annotations

import pytest

from calculet.errors import RequestError
from calculet.server.config import ServerConfig
from calculet.server.model_spec import ModelSpec, from_argument, read_models_toml


def test_name_equals_path_or_a_derived_name():
    base = ServerConfig().model_spec()
    assert from_argument("chat=/m/gemma.calbin", base).name == "chat"
    spec = from_argument("/m/qwen.gguf", base)
    assert spec.name is None and spec.source == "/m/qwen.gguf"
    assert spec.name_for(None, None) == "qwen"
    assert from_argument("./dir=odd/model.calbin", base).name is None   # '=' inside a path is not a name


def test_models_toml_takes_the_flags_for_keys_left_out(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text('[[model]]\nname = "a"\ncalbin = "/x/a.calbin"\nchips = [1]\nmax_queue = 4\n'
                    '[[model]]\nsource = "/x/b"\nchat_template = "chatml"\nrequest_timeout = 5\n')
    base = ServerConfig(max_queue=99, max_prefill_tokens=256).model_spec()
    a, b = read_models_toml(str(path), base)
    assert (a.name, a.source, a.chips, a.max_queue, a.max_prefill_tokens) == ("a", "/x/a.calbin", (1,), 4, 256)
    assert (b.name, b.chips, b.max_queue, b.chat_template, b.request_timeout_s) == (None, None, 99, "chatml", 5.0)
    assert b.partition == "" and read_models_toml(str(path), ServerConfig(chips=2, partition="tp").model_spec())[1].partition == "tp"


@pytest.mark.parametrize("text, says", [
    ('[[model]]\nsource = "x"\nlanez = 4\n', "unknown key 'lanez'; allowed: name, source"),
    ('[[model]]\nsource = "x"\ncalbin = "y"\n', "source or calbin, not both"),
    ('[[model]]\nsource = "x"\nchips = "0"\n', "chips must be a list"),
    ('[[model]]\nsource = "x"\nlanes = 0\n', "lanes must be in 1..256"),
    ('[[model]]\nsource = "x"\npartition = "dp"\n', "partition must be one of pp, tp, ep (or none), got 'dp'"),
    ('[[model]]\nsource = "x"\nmax_queue = "a"\n', "max_queue must be a int"),
    ('[[model]]\nsource = "x"\nchat_template = "nope"\n', "nope"),
    ('name = "x"\n', "at least one [[model]]"),
    ('[[model]\n', "not valid TOML"),
])
def test_bad_models_file_says_what_and_the_allowed_values(tmp_path, text, says):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(RequestError) as exc:
        read_models_toml(str(path), ServerConfig().model_spec())
    assert exc.value.code == "bad_option" and says in exc.value.message


def test_config_refuses_a_chip_that_does_not_exist_and_duplicate_names():
    with pytest.raises(RequestError) as exc:
        ServerConfig(chips=2, models=(ModelSpec("/a.calbin", "a", chips=(2,)),))
    assert "chip 2 does not exist" in exc.value.message and "0..1" in exc.value.message
    with pytest.raises(RequestError) as exc:
        ServerConfig(models=(ModelSpec("/x/a.calbin"), ModelSpec("/y/a.calbin")))
    assert "two models are named 'a'" in exc.value.message
    assert ServerConfig().model_specs() == (ServerConfig().model_spec(),)   # no args: the default model alone


def test_a_partition_needs_two_chips_and_compiles_for_the_chips_the_model_gets():
    with pytest.raises(RequestError, match="--partition tp splits a model over 2 or more chips; give --chips 2"):
        ServerConfig(partition="tp")
    with pytest.raises(RequestError, match="--partition pp splits a model over 2 or more chips"):
        ServerConfig(chips=2, models=(ModelSpec("/a", "a", chips=(1,), partition="pp"),))
    config = ServerConfig(chips=3, partition="tp")
    assert config.compile_chips(config.model_spec()) == 3                       # names none: all the server's chips
    assert config.compile_chips(ModelSpec("/a", chips=(0, 2), partition="tp")) == 2
    assert config.compile_chips(ModelSpec("/a", chips=(0, 2))) == 1               # no partition: one chip


def test_step_budget_and_in_flight_reach_each_models_engine(tmp_path):
    """Guards against the serve flags --step-token-budget / --in-flight being dropped on the way to a
    model's engine (the server builds engines from ModelSpecs); models.toml may set them per model."""
    path = tmp_path / "models.toml"
    path.write_text('[[model]]\nname = "a"\ncalbin = "/x/a.calbin"\nin_flight = 2\n'
                    '[[model]]\nname = "b"\ncalbin = "/x/b.calbin"\nstep_token_budget = 0\nttft_target = 0.5\n')
    base = ServerConfig(step_token_budget=32, in_flight=1).model_spec()
    assert (base.engine_config().step_token_budget, base.engine_config().in_flight) == (32, 1)
    a, b = read_models_toml(str(path), base)
    assert (a.engine_config().step_token_budget, a.engine_config().in_flight) == (32, 2)
    assert (b.engine_config().step_token_budget, b.engine_config().in_flight) == (0, 1)
    assert (a.engine_config().ttft_target_s, b.engine_config().ttft_target_s) == (None, 0.5)
    path.write_text('[[model]]\ncalbin = "/x/c.calbin"\nin_flight = 3\n')
    with pytest.raises(RequestError, match="--in-flight must be 1 or 2"):
        read_models_toml(str(path), base)


def test_prefix_cache_from_the_flag_and_per_model_in_toml(tmp_path):
    """--no-prefix-cache reaches every model's engine; a models.toml table may switch it per model."""
    assert ServerConfig().model_spec().engine_config().prefix_cache is True
    base = ServerConfig(prefix_cache=False).model_spec()
    assert base.engine_config().prefix_cache is False
    path = tmp_path / "models.toml"
    path.write_text('[[model]]\nname = "a"\nprefix_cache = true\n[[model]]\nname = "b"\n')
    a, b = read_models_toml(str(path), base)
    assert a.engine_config().prefix_cache is True and b.engine_config().prefix_cache is False
    path.write_text('[[model]]\nname = "a"\nprefix_cache = "no"\n')
    with pytest.raises(RequestError, match="prefix_cache must be true or false"):
        read_models_toml(str(path), base)
