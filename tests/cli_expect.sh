# Sourced by the CLI tests: expect WORDS-IN-MESSAGE ARGS... runs "$bin" ARGS and checks that it
# exits with status 2 and prints WORDS-IN-MESSAGE; a miss sets fail=1 and says which.
fail=0
expect() {
  want=$1
  shift
  msg=$("$bin" "$@" 2>&1)
  rc=$?
  case "$msg" in
    *"$want"*) [ $rc -eq 2 ] || { echo "FAIL: exit $rc for: $*"; fail=1; } ;;
    *) echo "FAIL: '$want' not in '$msg' for: $*"; fail=1 ;;
  esac
}
