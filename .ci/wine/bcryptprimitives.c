/* A stand-in for Windows' bcryptprimitives.dll, which Debian's wine 8.0 lacks: Rust's std
 * (since 1.78) gets its random seeds from ProcessPrng there. This forwards to RtlGenRandom
 * (advapi32's SystemFunction036), which wine has. Built by .ci/windows.sh with mingw-w64 and
 * placed beside the test binaries; never shipped. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG len);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
