"""The claims API's wire models live in corral.api.wire (shared with the SDK, which must not import the operator);
re-exported here for the server modules that import them from `.models`."""

from corral.api.wire import *  # noqa: F401,F403
