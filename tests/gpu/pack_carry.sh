#!/bin/bash
# pack_carry.sh NAME SCRIPT BIN... - packs one device call (run it HERE,
# in the repository root, after building build-cuda): build-NAME/ gets
# the listed binaries from build-cuda (gpu/X -> gpu/X, bin/X -> bin/X,
# stripped; obj/X.cu.o -> obj/, an object file for cuobjdump there),
# the libraries the device lacks (../shared/tools/devlibs) and, with
# the word `shared`, the tiny models plus the trained draft heads of
# build-spec-carry/shared/heads; it is compressed into
# .carry/NAME.tar.xz next to .carry/call.sh, which unpacks it and runs
# SCRIPT on it.  Then:
#   run(carry=[".carry"], command="bash .carry/call.sh")
# tests/X -> tests/X: a CTest program of the CUDA build (e.g.
# tests/worker_test_serve_shapes), run there with device arguments.
# pylib: the git-ignored .pylib/ of the repository root (pure-Python
# packages the device lacks, e.g. compressed-tensors) -> pylib/.
# A/B inside one call (machines differ by up to 3% on the same binary):
# AB_FROM=DIR adds DIR/gpu/X as gpu/X_b for every gpu/X listed, e.g. the
# build-OLDNAME/ folder of an earlier call.  .carry/ is git-ignored; the
# carry limit is 64 MiB.
set -eu
name=$1; script=$2; shift 2
d=build-$name
if [ -n "${AB_FROM:-}" ] && [ "$(realpath "$AB_FROM")" = "$(realpath -m "$d")" ]; then
  echo "pack_carry.sh: AB_FROM=$AB_FROM is the folder being packed" >&2; exit 2; fi
rm -rf "$d"; mkdir -p "$d/bin" "$d/gpu" "$d/lib" .carry
for b in "$@"; do
  case $b in
    gpu/*) cp "build-cuda/$b" "$d/gpu/"
           if [ -n "${AB_FROM:-}" ] && [ -f "$AB_FROM/$b" ]; then
             cp "$AB_FROM/$b" "$d/${b}_b"; fi;;
    bin/*) cp "build-cuda/$b" "$d/bin/";;
    tests/*) mkdir -p "$d/tests"; cp "build-cuda/$b" "$d/tests/";;
    obj/*) mkdir -p "$d/obj"   # a kernel object, to disassemble there
           cp "$(find build-cuda -name "${b#obj/}" | head -1)" "$d/obj/";;
    shared) mkdir -p "$d/shared"
            cp -r ../shared/models "$d/shared/"
            chmod -R u+w "$d/shared"
            if [ -d build-spec-carry/shared/heads ]; then
              cp -r build-spec-carry/shared/heads "$d/shared/"; fi;;
    pylib) [ -d .pylib ] || { echo "pack_carry.sh: no .pylib/" >&2; exit 2; }
           cp -r .pylib "$d/pylib"
           find "$d/pylib" -name __pycache__ -prune -exec rm -rf {} +;;
    *) echo "pack_carry.sh: unknown item $b" >&2; exit 2;;
  esac
done
strip "$d"/bin/* "$d"/gpu/* "$d"/tests/* 2>/dev/null || true
../shared/tools/devlibs "$d/lib" "$d"/bin/* "$d"/gpu/* "$d"/tests/* \
  >/dev/null 2>&1
# the CUPTI tracer's libcupti (devlibs leaves it out)
if [ -f "$d/gpu/libbt_kernel_trace.so" ]; then
  cupti=$(ldd "build-cuda/gpu/libbt_kernel_trace.so" | awk '/libcupti/ {print $3}')
  [ -n "$cupti" ] && cp -L "$cupti" "$d/lib/"
fi
rm -f .carry/*.tar.xz
tar cf - "$d" | xz -T2 -6 > ".carry/$name.tar.xz"
cat > .carry/call.sh <<EOS
cd \$(dirname \$0)/..
tar xJf .carry/$name.tar.xz
bash $script $d
EOS
ls -la ".carry/$name.tar.xz"
