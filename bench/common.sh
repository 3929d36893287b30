# What the instruction-counting benchmarks share (sourced, not run): valgrind checked, this tree's
# release megascope built ($bin), a work folder ($work, removed at exit with anything named in
# $cleanup), the demo's token file in it ($work/data.bin) and the demo's model ($model).
command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
cmake --preset release >/dev/null
cmake --build --preset release --target megascope >/dev/null
bin=$PWD/build/release/cli/megascope
work=$(mktemp -d)
cleanup=${cleanup:-}
trap 'rm -rf "$work" $cleanup' EXIT
$bin prepare-data tests/data/text/notes_on_training.txt -o "$work/data.bin" >/dev/null
model="--layers 2 --width 64 --heads 4 --seq 32 --batch 8 --microbatches 2"
