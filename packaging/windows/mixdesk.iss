; Inno Setup script for Mixdesk (Windows). Build with packaging\windows\build.ps1.
; Keep AppVersion in step with pyproject.toml.
#define AppVersion "0.1.0"

[Setup]
AppId={{6E0C3B52-3F0B-4E4A-9B8E-7A4D1C2F9E11}
AppName=Mixdesk
AppVersion={#AppVersion}
AppPublisher=Mixdesk developers
DefaultDirName={autopf}\Mixdesk
DefaultGroupName=Mixdesk
OutputBaseFilename=Mixdesk-{#AppVersion}-setup
Compression=lzma2/ultra64
SolidCompression=yes
ArchitecturesInstallIn64BitMode=x64compatible
PrivilegesRequiredOverridesAllowed=dialog
SetupIconFile=..\linux\mixdesk.ico
WizardStyle=modern

[Files]
; the PyInstaller one-folder bundle made by build.ps1
Source: "..\..\build\windows\dist\mixdesk\*"; DestDir: "{app}"; Flags: recursesubdirs ignoreversion

[Icons]
Name: "{group}\Mixdesk"; Filename: "{app}\mixdesk.exe"
Name: "{autodesktop}\Mixdesk"; Filename: "{app}\mixdesk.exe"; Tasks: desktopicon

[Tasks]
Name: "desktopicon"; Description: "Create a desktop icon"; Flags: unchecked

[Run]
Filename: "{app}\mixdesk.exe"; Description: "Start Mixdesk"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; the GPU runtime (a CUDA torch, several GB) that the app fetched into the user's folders on first
; run (engine/tools/runtime); chats and models stay
Type: filesandordirs; Name: "{localappdata}\mixdesk\runtime"
Type: filesandordirs; Name: "{localappdata}\mixdesk\Cache\runtime-downloads"
