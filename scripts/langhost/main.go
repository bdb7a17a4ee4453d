// Command pulumi-language-python is the test bed's Pulumi language host for Python programs.
//
// Why Corral has its own: the upstream host lives in an untagged module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) that the Go module proxy reachable here does
// not serve, so it cannot be built offline. The engine <-> host protocol is small for what Corral needs: run a
// program (`pulumi preview/up/destroy`) and run a plugin (a Python component provider, `pulumi package get-schema`).
// Both delegate to the `pulumi-language-python-exec` script and the `pulumi` Python package, exactly like upstream.
// Dependency installation and code generation are not offered: the project's venv is set up by scripts/setup.sh.
//
// Python is chosen as: the `virtualenv` runtime option of Pulumi.yaml (relative to the project root), else
// $PULUMI_PYTHON_CMD, else `python3` on PATH (an activated venv wins).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pulumi/pulumi/sdk/v3/go/common/util/rpcutil"
	"github.com/pulumi/pulumi/sdk/v3/go/common/version"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

func main() {
	flag.String("tracing", "", "ignored: tracing endpoint")
	flag.String("root", "", "ignored: project root")
	flag.Parse()
	engine := ""
	if flag.NArg() > 0 {
		engine = flag.Arg(0)
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	execScript := filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
	if _, err := os.Stat(execScript); err != nil {
		fail(fmt.Errorf("%s is missing; rebuild with scripts/toolchain.sh pulumi", execScript))
	}
	host := &languageHost{exec: execScript, engine: engine}
	handle, err := rpcutil.ServeWithOptions(rpcutil.ServeOptions{
		Init: func(srv *grpc.Server) error {
			pulumirpc.RegisterLanguageRuntimeServer(srv, host)
			return nil
		},
	})
	if err != nil {
		fail(err)
	}
	fmt.Printf("%d\n", handle.Port)
	if err := <-handle.Done; err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
	os.Exit(1)
}

type languageHost struct {
	pulumirpc.UnimplementedLanguageRuntimeServer
	exec   string
	engine string
}

func (h *languageHost) Handshake(_ context.Context, req *pulumirpc.LanguageHandshakeRequest) (*pulumirpc.LanguageHandshakeResponse, error) {
	if req.GetEngineAddress() != "" {
		h.engine = req.GetEngineAddress()
	}
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

func (h *languageHost) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: strings.TrimPrefix(version.Version, "v")}, nil
}

// Plugins are installed by scripts/toolchain.sh, never downloaded, so the program announces none up front; the
// engine loads each provider when the program first registers one of its resources.
func (h *languageHost) GetRequiredPlugins(context.Context, *pulumirpc.GetRequiredPluginsRequest) (*pulumirpc.GetRequiredPluginsResponse, error) {
	return &pulumirpc.GetRequiredPluginsResponse{}, nil
}

func (h *languageHost) GetRequiredPackages(context.Context, *pulumirpc.GetRequiredPackagesRequest) (*pulumirpc.GetRequiredPackagesResponse, error) {
	return &pulumirpc.GetRequiredPackagesResponse{}, nil
}

func (h *languageHost) RuntimeOptionsPrompts(context.Context, *pulumirpc.RuntimeOptionsRequest) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

func (h *languageHost) GetProgramDependencies(context.Context, *pulumirpc.GetProgramDependenciesRequest) (*pulumirpc.GetProgramDependenciesResponse, error) {
	return &pulumirpc.GetProgramDependenciesResponse{}, nil
}

func (h *languageHost) About(_ context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	py := python(req.GetInfo())
	out, _ := exec.Command(py, "--version").Output()
	return &pulumirpc.AboutResponse{Executable: py, Version: strings.TrimSpace(strings.TrimPrefix(string(out), "Python "))}, nil
}

func (h *languageHost) InstallDependencies(req *pulumirpc.InstallDependenciesRequest, srv grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse]) error {
	msg := "dependencies are installed by scripts/setup.sh (pip install -e .); nothing to do\n"
	return srv.Send(&pulumirpc.InstallDependenciesResponse{Stdout: []byte(msg)})
}

// python picks the interpreter for a program (see the package comment).
func python(info *pulumirpc.ProgramInfo) string {
	if info != nil && info.GetOptions() != nil {
		if v, ok := info.GetOptions().GetFields()["virtualenv"]; ok && v.GetStringValue() != "" {
			venv := v.GetStringValue()
			if !filepath.IsAbs(venv) {
				venv = filepath.Join(info.GetRootDirectory(), venv)
			}
			return filepath.Join(venv, "bin", "python")
		}
	}
	if cmd := os.Getenv("PULUMI_PYTHON_CMD"); cmd != "" {
		return cmd
	}
	return "python3"
}

func (h *languageHost) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	args := []string{"-u", h.exec}
	add := func(k, v string) {
		if v != "" {
			args = append(args, "--"+k, v)
		}
	}
	add("monitor", req.GetMonitorAddress())
	add("engine", h.engine)
	add("project", req.GetProject())
	add("stack", req.GetStack())
	add("pwd", req.GetPwd())
	add("dry_run", fmt.Sprintf("%v", req.GetDryRun()))
	add("parallel", fmt.Sprint(req.GetParallel()))
	add("organization", req.GetOrganization())
	root := req.GetInfo().GetRootDirectory()
	add("root_directory", root)
	program := req.GetProgram()
	if program == "" {
		program = "."
		if dir := req.GetInfo().GetProgramDirectory(); dir != "" {
			program = dir
		}
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	config, err := json.Marshal(req.GetConfig())
	if err != nil {
		return nil, err
	}
	secretKeys, err := json.Marshal(req.GetConfigSecretKeys())
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, python(req.GetInfo()), args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "PULUMI_CONFIG="+string(config), "PULUMI_CONFIG_SECRET_KEYS="+string(secretKeys))
	if err := cmd.Run(); err != nil {
		var exitErr *exec.ExitError
		if errors.As(err, &exitErr) {
			// Exit code 32: the program already showed the user an actionable message.
			if exitErr.ExitCode() == 32 {
				return &pulumirpc.RunResponse{Bail: true}, nil
			}
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d", exitErr.ExitCode())}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("could not run %s: %v", cmd.Path, err)}, nil
	}
	return &pulumirpc.RunResponse{}, nil
}

// RunPlugin runs a plugin written in Python (a component provider's `__main__.py`) and streams its output.
func (h *languageHost) RunPlugin(req *pulumirpc.RunPluginRequest, srv grpc.ServerStreamingServer[pulumirpc.RunPluginResponse]) error {
	program := req.GetInfo().GetProgramDirectory()
	if program == "" {
		program = req.GetProgram()
	}
	if program == "" {
		return status.Error(codes.InvalidArgument, "RunPlugin: no program directory")
	}
	cmd := exec.CommandContext(srv.Context(), python(req.GetInfo()), append([]string{"-u", program}, req.GetArgs()...)...)
	cmd.Dir = req.GetPwd()
	cmd.Env = append(os.Environ(), req.GetEnv()...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	var mu sync.Mutex
	send := func(r *pulumirpc.RunPluginResponse) {
		mu.Lock()
		defer mu.Unlock()
		_ = srv.Send(r)
	}
	var wg sync.WaitGroup
	pump := func(r io.Reader, wrap func([]byte) *pulumirpc.RunPluginResponse) {
		defer wg.Done()
		buf := make([]byte, 32*1024)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				send(wrap(append([]byte(nil), buf[:n]...)))
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(stdout, func(b []byte) *pulumirpc.RunPluginResponse {
		return &pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stdout{Stdout: b}}
	})
	go pump(stderr, func(b []byte) *pulumirpc.RunPluginResponse {
		return &pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Stderr{Stderr: b}}
	})
	wg.Wait()
	code := int32(0)
	if err := cmd.Wait(); err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			return err
		}
		code = int32(exitErr.ExitCode())
	}
	send(&pulumirpc.RunPluginResponse{Output: &pulumirpc.RunPluginResponse_Exitcode{Exitcode: code}})
	return nil
}
