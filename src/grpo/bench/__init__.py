"""`grpo bench`: seconds and memory per GRPO step, measured as ratios in one run (docs: bench/README.md).

    run.py       the plan, the run and the command line (`grpo bench`)
    workload.py  the measured work: one (model, shape, G) three ways (our step, the plain-torch floor, HF generate)
    report.py    fitted exponents, acceptance checks, the table
    vocab.py     the real-vocabulary part (a Qwen2-shaped model with 151,936 tokens)
    engines.py   the engine axis (native sampler, vLLM, transformers generate)
    versus_trl.py       seconds per step against TRL's GRPOTrainer on one model (`grpo bench --versus-trl`)
    learning_vs_trl.py  held-out accuracy gained per CPU-minute against TRL (`grpo bench --versus-trl --learn`)
    results.py   where every benchmark writes: $GRPO_CACHE/bench-results/ unless --output names a file (the
                 committed bench/results/*.json the docs quote are rewritten only that way)
"""

from grpo.bench.report import fit_exponent
from grpo.bench.run import main
from grpo.tracking.memory import peak_rss_mb, reset_peak_rss

__all__ = ["fit_exponent", "main", "peak_rss_mb", "reset_peak_rss"]
