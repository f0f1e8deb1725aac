import pytest

from bert_mgpu.parallel.precision import choose_precision, cpu_flags


def test_auto_picks_float16_on_tensor_core_gpus():
    assert choose_precision("auto", [(8, 0), (7, 0)], set())[0] == "mixed_float16"
    policy, why = choose_precision("auto", [(8, 0), (6, 1)], set())
    assert policy == "float32" and "6.1 < 7.0" in why


def test_auto_picks_bfloat16_on_amx_or_avx512bf16_cpus():
    assert choose_precision("auto", [], {"avx512f", "amx_bf16"})[0] == "mixed_bfloat16"
    assert choose_precision("auto", [], {"avx512_bf16"}) == ("mixed_bfloat16",
                                                            "CPU has avx512_bf16 (fast bfloat16 matmul)")
    assert choose_precision("auto", [], {"avx2"})[0] == "float32"


def test_explicit_choice_wins_and_bad_value_fails():
    assert choose_precision("float32", [(9, 0)], set()) == ("float32", "requested by --precision")
    with pytest.raises(ValueError):
        choose_precision("fp8", [], set())


def test_cpu_flags_reads_proc_format(tmp_path):
    p = tmp_path / "cpuinfo"
    p.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_tile\n")
    assert cpu_flags(str(p)) == {"fpu", "avx512_bf16", "amx_tile"}
    assert cpu_flags(str(tmp_path / "missing")) == set()
