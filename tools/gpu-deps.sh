# Sourced by tools/gpu-check.sh and tools/gpu-measure.sh (after BUILD is set): the Debian packages k3c builds
# against, taken from tools/debs/ where the GPU host has no headers (GPU hosts here reach no package registry).
# Exports CFLAGS / LDLIBS / SERVER_LIBS for make; exits on what it cannot provide.

if ! printf '#include <cjson/cJSON.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
    if ! ls tools/debs/libcjson*.deb >/dev/null 2>&1; then
        echo "gpu-check: cJSON headers not installed and no tools/debs/libcjson*.deb to unpack" >&2
        exit 1
    fi
    mkdir -p "$BUILD"
    prefix=$PWD/$BUILD/debs-root
    for f in tools/debs/libcjson*.deb; do dpkg -x "$f" "$prefix" || exit 1; done
    libdir=$(dirname "$(find "$prefix" -name 'libcjson.so*' | head -1)")
    export CFLAGS="${CFLAGS:--O2 -g} -I$prefix/usr/include"
    export LDLIBS="${LDLIBS:-} -L$libdir -Wl,-rpath,$libdir"
    echo "gpu-check: cJSON from tools/debs ($libdir)"
fi

# PCRE2 (the tokenizer's pre-split) likewise: Debian 12's libpcre2-dev 10.42 (BSD-licensed, `apt-get download
# libpcre2-dev`) committed in tools/debs/ and unpacked beside it; its libpcre2-8.so link points at the runtime
# package, not unpacked, so the linker takes the static libpcre2-8.a from it and the host needs nothing.
if ! printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
    if ! ls tools/debs/libpcre2-dev*.deb >/dev/null 2>&1; then
        echo "gpu-check: PCRE2 headers not installed and no tools/debs/libpcre2-dev*.deb to unpack" >&2
        exit 1
    fi
    mkdir -p "$BUILD"
    prefix=$PWD/$BUILD/debs-root
    dpkg -x tools/debs/libpcre2-dev*.deb "$prefix" || exit 1
    libdir=$(dirname "$(find "$prefix" -name 'libpcre2-8.a' | head -1)")
    export CFLAGS="${CFLAGS:--O2 -g} -I$prefix/usr/include"
    export LDLIBS="${LDLIBS:-} -L$libdir"
    echo "gpu-check: PCRE2 from tools/debs ($libdir, static)"
fi

# libmicrohttpd (k3c serve) likewise: Debian 12's libmicrohttpd-dev 0.9.75 (LGPL, `apt-get download
# libmicrohttpd-dev`) in tools/debs/, linked statically from its libmicrohttpd.a; that archive calls GnuTLS,
# taken from the host's runtime libgnutls.so.30 (no -dev package needed). Checked without CFLAGS: a reused
# build folder's debs-root already holds the header, but the static archive still needs SERVER_LIBS.
if ! printf '#include <microhttpd.h>\n' | ${CC:-cc} -E -x c - >/dev/null 2>&1; then
    if ! ls tools/debs/libmicrohttpd-dev*.deb >/dev/null 2>&1; then
        echo "gpu-check: libmicrohttpd headers not installed and no tools/debs/libmicrohttpd-dev*.deb to unpack" >&2
        exit 1
    fi
    gnutls=$(ldconfig -p 2>/dev/null | awk '/libgnutls\.so\.30 /{print $NF; exit}')
    if [ -z "$gnutls" ]; then
        echo "gpu-check: libmicrohttpd.a needs the host's libgnutls.so.30, which ldconfig does not list" >&2
        exit 1
    fi
    mkdir -p "$BUILD"
    prefix=$PWD/$BUILD/debs-root
    dpkg -x tools/debs/libmicrohttpd-dev*.deb "$prefix" || exit 1
    export CFLAGS="${CFLAGS:--O2 -g} -I$prefix/usr/include"
    export SERVER_LIBS="$(find "$prefix" -name 'libmicrohttpd.a' | head -1) $gnutls"
    echo "gpu-check: libmicrohttpd from tools/debs (static, GnuTLS $gnutls)"
fi
