"""The supervisor process: its loop, the dispatcher of ring records, credit flow, alarms,
durability, control."""

from ipc.compiled import sources_only

sources_only(__path__)
