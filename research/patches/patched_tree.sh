# Sourced by the device scripts (ab_next.sh, step_ab.sh, call_s42*.sh): patched_tree NAME DEST copies the working tree
# of the repository root ($PWD; not .wt, .git or a virtual environment) to DEST, afresh, and applies
# research/patches/NAME.patch there (`patch -p1`: the device's copy is no git repository); it
# exits the script if the patch does not apply. A patch the tree already holds (applied to the
# working tree before the call, e.g. to run the whole GPU suite with it) is not applied twice: the
# copy is then the tree as it is, and a line says so (an A/B of it compares the tree with itself).
patched_tree() {
  local name=$1 dest=$2 root=$PWD
  rm -rf "$dest"; mkdir -p "$dest"
  (cd "$root" && tar --exclude=./.wt --exclude=./.git --exclude=./.venv --exclude=./venv -cf - .) | (cd "$dest" && tar -xf -)
  if (cd "$dest" && patch -s -f -R -p1 --dry-run < "$root/research/patches/$name.patch" > /dev/null 2>&1); then
    echo "$name.patch is already in the tree: $dest is the tree unchanged"
    return 0
  fi
  (cd "$dest" && patch -s -p1 < "$root/research/patches/$name.patch") || { echo "$name.patch does not apply"; exit 1; }
}
# xdist_opt: "-n 8" where pytest-xdist is installed (the H200 image has it), else nothing: the GPU
# tests' kernel compiles side by side.
xdist_opt() { python -c 'import xdist' 2>/dev/null && echo '-n 8'; }
