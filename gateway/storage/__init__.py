"""The gateway's side of its storage: health as operators see it, and the periodic retention
sweeps. Tables and statements are persistence/'s."""
