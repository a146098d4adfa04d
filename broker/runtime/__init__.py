"""The supervisor process: its loop, the dispatcher of ring records, credit flow, alarms,
durability, control."""
