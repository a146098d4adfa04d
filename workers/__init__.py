from ipc.compiled import sources_only

sources_only(__path__)
