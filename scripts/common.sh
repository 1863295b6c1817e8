# Shared set-up of the benchmark scripts; source it first:
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
# It moves to the repository root ($ROOT) and defines say, build_cli, python_with and
# translation_defaults.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# A progress line on stderr, so that stdout stays the script's result.
say() { echo "[bench] $*" >&2; }

# Builds the command-line tool (release) and sets BIN to it.
build_cli() {
    say "building: cargo build --release -p transformer-cli"
    cargo build --release -p transformer-cli >&2
    BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/transformer"
    [[ -x "$BIN" ]] || { echo "error: $BIN was not built" >&2; exit 1; }
}

# Sets PY to a Python that imports every module named: $PYTHON when set (an error names what
# it lacks), otherwise .venv/bin/python in the repository root, created with python3 -m venv
# and given the modules with pip when it lacks one (numpy and torch are large downloads).
python_with() {
    local imports
    imports="$(IFS=,; echo "$*")"
    if [[ -n "${PYTHON:-}" ]]; then
        PY="$PYTHON"
        say "using PYTHON=$PY"
        "$PY" -c "import $imports" 2>/dev/null && return
        echo "error: $PY cannot import $* (install them there, or unset PYTHON to use .venv)" >&2
        exit 1
    fi
    PY="$ROOT/.venv/bin/python"
    if [[ ! -x "$PY" ]]; then
        say "no PYTHON set and no .venv: creating one with python3 -m venv .venv"
        python3 -m venv "$ROOT/.venv"
    fi
    if ! "$PY" -c "import $imports" 2>/dev/null; then
        say "installing $* into .venv (pip install $*; torch is a large download, several minutes)"
        "$ROOT/.venv/bin/pip" install "$@" >&2
    fi
}

# The defaults of the translation benchmarks' common settings: RUN (runs/de-en), SRC (Multi30k's
# test_2016_flickr.de.gz), SENTENCES (1000) and THREADS (all cores).
translation_defaults() {
    RUN="${RUN:-runs/de-en}"
    SRC="${SRC:-../shared/data/multi30k/task1/raw/test_2016_flickr.de.gz}"
    SENTENCES="${SENTENCES:-1000}"
    THREADS="${THREADS:-$(nproc)}"
}
