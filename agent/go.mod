// Warren's in-sandbox agent: speaks the process, filesystem and file-transfer
// protocol of E2B's envd so E2B's SDKs work against a Warren sandbox.
// Standard library only: no third-party dependencies.
module warren.dev/agent

go 1.24
