# Sourced by the device scripts that run the core bundle's test binaries
# directly (device-sanitize.sh, device-check-issue10.sh): unpacks the payload
# that scripts/device-test.sh staged under .device/$DEVICE_BUNDLE (default
# core; combo holds the test binaries it was built with) and sets up the
# environment the binaries expect. Sets W to the folder of the binaries.
OUT=${OUT:-/tmp/gpq-out}
mkdir -p "$OUT"
timeout 120 bash ".device/${DEVICE_BUNDLE:-core}/run.sh" info > /dev/null 2>&1   # unpacks the payload
W=/root/gpq-work/bin
export LD_LIBRARY_PATH=/root/gpq-work/lib:/usr/local/cuda/lib64
export GPQ_REQUIRE_GPU=1 GPQ_REQUIRE_NVCOMP=1 GPQ_TESTDATA=$PWD/testdata
export GPQ_PARQUET_TESTING=/root/gpq-work/data/parquet-testing GPQ_KERNEL_CACHE=/root/gpq-work/kernel-cache
