# Two commands on a fresh machine: `make book` builds the HTML book, `make test` runs every test.
# Both create .venv when it is missing; re-running them when everything is in place takes seconds.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ASSETS_STAMP := _offline/.stamp-offline-assets
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_PROGRESS_BARS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: help venv assets book archive check test lab lecture serve api execute model bench clean

help:
	@echo "make book     build the HTML book into _build/html (and the course archive decodelab-course.zip)"
	@echo "make archive  only the course archive, _build/html/decodelab-course.zip"
	@echo "make check    the fast loop: library unit tests and docstring examples (no nbval, book or browser)"
	@echo "make test     run the whole suite (library, notebooks via nbval, book build, browser)"
	@echo "make lab      JupyterLab on the repository, opened on exercises/, with the course's environment"
	@echo "make lecture  JupyterLab on the repository, opened on chapters/, to present a chapter with live widgets"
	@echo "make serve    serve the built book on http://127.0.0.1:8000"
	@echo "make execute  re-execute the notebooks whose notebook or library changed"
	@echo "make model    retrain the shipped models (tiny-zh, tiny-zh-doc)"
	@echo "make bench    run the benchmarks (tables + JSON in benchmarks/results/)"
	@echo "make api      the OpenAI-compatible server on http://127.0.0.1:8000/v1 (tiny-zh)"

$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@# JupyterLab: no news popup for students (binder/postBuild runs the same script).
	@bash scripts/jupyterlab_settings.sh $(VENV)
	@touch $@

venv: $(STAMP)

$(ASSETS_STAMP): scripts/fetch_offline_assets.sh | $(STAMP)
	bash scripts/fetch_offline_assets.sh

assets: $(ASSETS_STAMP)

# The build also writes the course archive, _build/html/decodelab-course.zip (book/course_archive.py, after the HTML);
# `make archive` rewrites only the archive.
book: venv assets
	$(BIN)/jupyter-book build . -W -n --keep-going --all
	@echo "Book built: open file://$(CURDIR)/_build/html/index.html (or run: make serve)"
	@echo "Course archive: $(CURDIR)/_build/html/decodelab-course.zip (linked from every page's download menu)"

archive: venv
	@mkdir -p _build/html
	$(BIN)/python book/course_archive.py _build/html/decodelab-course.zip

NBVAL := $(BIN)/pytest --nbval --nbval-sanitize-with tests/sanitize.cfg

# First the chapters on torch's portable CPU kernels (ATEN_CPU_CAPABILITY=default: no AVX2, no AVX-512), then on
# AVX2's (what most readers' CPUs run) where the CPU has AVX2 and its own kernels are AVX-512's: torch does not check
# the hardware when told avx2, so a CPU without it is skipped, and one whose own kernels are AVX2's runs them below.
# Their float rounding differs from each other's and from AVX-512's, so a stored output that depends on the CPU (a
# count of exact float ties, an unrounded float32 sum) fails here rather than on a reader's machine. Then the whole
# suite on the native kernels.
test: venv assets
	ATEN_CPU_CAPABILITY=default $(NBVAL) chapters
	@if grep -qw avx512f /proc/cpuinfo 2>/dev/null && grep -qw avx2 /proc/cpuinfo; then \
		echo "ATEN_CPU_CAPABILITY=avx2 $(NBVAL) chapters"; ATEN_CPU_CAPABILITY=avx2 $(NBVAL) chapters; \
	else echo "AVX2 pass skipped: this CPU's own kernels are AVX2's (the pass below) or it has no AVX2"; fi
	$(NBVAL) --durations=15 --doctest-modules tests chapters exercises lib/decodelab \
		--ignore=lib/decodelab/serve/__main__.py

# The inner loop, under 2 minutes on 2 cores: the library's tests without the slow ones (benchmark smoke runs, servers
# in child processes, statistical tests with many draws), nbval, the book build and the browser; plus every docstring
# example in lib/decodelab. `make test` runs all of it.
check: venv
	$(BIN)/pytest -q -n 2 -p no:cacheprovider -m "not slow and not book and not browser" --doctest-modules \
		tests lib/decodelab --ignore=lib/decodelab/serve/__main__.py

api: venv
	$(BIN)/python -m decodelab.serve --model tiny-zh

# Both serve the repository root, so the links between exercises and chapters (../chapters/X.ipynb) open; `lab` opens
# on exercises/, `lecture` on chapters/ (tests/site/test_lab_root_browser.py reads these flags).
LAB_FLAGS := --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/exercises
LECTURE_FLAGS := --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/chapters

lab: venv
	$(BIN)/jupyter lab $(ROOT_FLAG) $(LAB_FLAGS)

lecture: venv
	$(BIN)/jupyter lab $(ROOT_FLAG) $(LECTURE_FLAGS)

serve: book
	@echo "Serving the book on http://127.0.0.1:8000 (Ctrl-C to stop)"
	$(BIN)/python -m http.server --bind 127.0.0.1 --directory _build/html 8000

# Notebooks are committed executed; nbval proves the stored outputs. This target re-executes a notebook
# when it or anything in the library (code or shipped model) is newer than its last execution. Starter exercises are
# executed too: their check cells are tagged `raises-exception`, so the stored output is the "not done yet" message.
LIB_SOURCES := $(shell find lib/decodelab -type f \( -name '*.py' -o -name '*.js' -o -name '*.css' -o -path '*assets*' \) 2>/dev/null)
NOTEBOOKS := $(wildcard chapters/*.ipynb exercises/*.ipynb exercises/solutions/*.ipynb)
EXEC_STAMPS := $(patsubst %.ipynb,_build/.executed/%.stamp,$(NOTEBOOKS))

_build/.executed/%.stamp: %.ipynb $(LIB_SOURCES) | $(STAMP)
	$(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=300 --ExecutePreprocessor.kernel_name=python3 $<
	@mkdir -p $(dir $@) && touch $@

execute: $(EXEC_STAMPS)

# The two shipped models every chapter uses (chapter 05's small twins have their own scripts, named in their cards).
model: venv
	$(BIN)/python -m decodelab.models.train --model tiny-zh
	$(BIN)/python -m decodelab.models.train --model tiny-zh-doc

bench: venv
	$(BIN)/python benchmarks/sampling.py
	$(BIN)/python benchmarks/serving.py
	$(BIN)/python benchmarks/rng_ab.py
	$(BIN)/python benchmarks/noise.py
	$(BIN)/python benchmarks/seeded_noise.py
	$(BIN)/python benchmarks/cold_draw.py
	$(BIN)/python benchmarks/draw_rounding.py
	$(BIN)/python benchmarks/step_batch.py
	$(BIN)/python benchmarks/attention.py
	$(BIN)/python benchmarks/roofline.py
	$(BIN)/python benchmarks/speculative.py
	$(BIN)/python benchmarks/load.py

clean:
	rm -rf _build .pytest_cache .jupyter_cache
