# Sourced by the install scripts: install_debian_packages TAG PACKAGE...
# installs, with apt-get, those of the Debian packages that are not installed
# yet, and says what it did (prefixed with TAG).
install_debian_packages() {
  local tag=$1
  shift
  local sudo="" missing=() p
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "$tag: apt-get installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "$tag: all $# Debian packages present"
  fi
}
