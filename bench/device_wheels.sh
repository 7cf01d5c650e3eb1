# Sourced by the device scripts (run from the repository root). The device machine has no network:
# Python packages it lacks (diffusers, cryptography, ...) travel as wheels in .whl/ and are
# installed into /tmp/site, put ahead of the checkout on PYTHONPATH; without them, the checkout alone.
use_carried_wheels() {  # $1: where pip's output goes
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl >"$1" 2>&1 && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD
    else
        export PYTHONPATH=$PWD
    fi
}
