// Command pulumi-language-python is the test bed's Pulumi language host for Python programs.
//
// Why Corral has its own: the upstream host lives in an untagged module
// (github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3) that the Go module proxy reachable here does
// not serve, so it cannot be built offline. The engine <-> host protocol is small for what Corral needs: run a
// program (`pulumi preview/up/destroy`), run a plugin (a Python component provider, `pulumi package get-schema`) and
// generate and link a Python SDK from a package schema (`pulumi package add`, with upstream's Python codegen). Running
// delegates to the `pulumi-language-python-exec` script and the `pulumi` Python package, exactly like upstream.
// Dependency installation is not offered: the project's venv is set up by scripts/setup.sh, so Link records a linked
// SDK in requirements.txt when the project has one and otherwise says how to install it.
//
// Python is chosen as: the `virtualenv` runtime option of Pulumi.yaml (relative to the project root), else
// $PULUMI_PYTHON_CMD, else `python3` on PATH (an activated venv wins).
//
// Flags are upstream's, so every engine can start it: -tracing, -use-executor (the exec script to run instead of
// the one next to this binary), and -virtualenv, -root, -typechecker, -toolchain, which engines built on older SDKs
// (pulumi-language-yaml v1.25.0's plugin host among them) pass as `-<option>=<value>` for each runtime option of a
// plugin's PulumiPlugin.yaml. Upstream now reads the options from each request only; here -virtualenv (relative to
// -root) is also used when a request carries no `virtualenv` option. -typechecker and -toolchain are accepted and
// ignored: no type checking, and dependencies come from scripts/setup.sh.
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

	pycodegen "github.com/pulumi/pulumi/pkg/v3/codegen/python"
	"github.com/pulumi/pulumi/pkg/v3/codegen/schema"
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
	virtualenv := flag.String("virtualenv", "", "virtual environment to use when a request names none (relative to -root)")
	root := flag.String("root", "", "project root the -virtualenv path is relative to")
	flag.String("typechecker", "", "ignored: no type checking")
	flag.String("toolchain", "pip", "ignored: dependencies are installed by scripts/setup.sh")
	useExecutor := flag.String("use-executor", "", "the exec script to run instead of the one next to this binary")
	flag.Parse()
	if *virtualenv != "" {
		defaultVenv = *virtualenv
		if !filepath.IsAbs(defaultVenv) {
			defaultVenv = filepath.Join(*root, defaultVenv)
		}
	}
	engine := ""
	if flag.NArg() > 0 {
		engine = flag.Arg(0)
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	execScript := filepath.Join(filepath.Dir(self), "pulumi-language-python-exec")
	if *useExecutor != "" {
		execScript = *useExecutor
	}
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

// defaultVenv is the -virtualenv flag made absolute ("" without one).
var defaultVenv string

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
	if defaultVenv != "" {
		return filepath.Join(defaultVenv, "bin", "python")
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

	// A stack without config sends none: the exec script wants `{}` and `[]`, never `null`.
	configMap, secretList := req.GetConfig(), req.GetConfigSecretKeys()
	if configMap == nil {
		configMap = map[string]string{}
	}
	if secretList == nil {
		secretList = []string{}
	}
	config, err := json.Marshal(configMap)
	if err != nil {
		return nil, err
	}
	secretKeys, err := json.Marshal(secretList)
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

// GeneratePackage writes a Python SDK for a package schema (upstream's codegen) into the request's directory.
func (h *languageHost) GeneratePackage(_ context.Context, req *pulumirpc.GeneratePackageRequest) (*pulumirpc.GeneratePackageResponse, error) {
	loader, err := schema.NewLoaderClient(req.GetLoaderTarget())
	if err != nil {
		return nil, err
	}
	defer loader.Close()
	var spec schema.PackageSpec
	if err := json.Unmarshal([]byte(req.GetSchema()), &spec); err != nil {
		return nil, fmt.Errorf("GeneratePackage: bad schema: %w", err)
	}
	pkg, diags, err := schema.BindSpec(spec, loader, schema.ValidationOptions{AllowDanglingReferences: true})
	if err != nil {
		return nil, err
	}
	if diags.HasErrors() {
		return nil, fmt.Errorf("GeneratePackage: schema of %s: %w", spec.Name, diags)
	}
	files, err := pycodegen.GeneratePackage("pulumi-language-python", pkg, req.GetExtraFiles(), loader)
	if err != nil {
		return nil, err
	}
	for name, data := range files {
		path := filepath.Join(req.GetDirectory(), name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return nil, err
		}
	}
	return &pulumirpc.GeneratePackageResponse{}, nil
}

// Link adds generated SDKs to the program: a `-e <path>` line in its requirements.txt when it has one (nothing is
// installed here), and instructions to import them.
func (h *languageHost) Link(_ context.Context, req *pulumirpc.LinkRequest) (*pulumirpc.LinkResponse, error) {
	root := req.GetInfo().GetRootDirectory()
	requirements := filepath.Join(root, "requirements.txt")
	var b strings.Builder
	for _, dep := range req.GetPackages() {
		name := dep.GetPackage().GetName()
		module := pycodegen.PyPack("", name)
		if _, err := os.Stat(requirements); err == nil {
			old, err := os.ReadFile(requirements)
			if err != nil {
				return nil, err
			}
			line := "-e " + dep.GetPath()
			if !strings.Contains("\n"+string(old)+"\n", "\n"+line+"\n") {
				if len(old) > 0 && !strings.HasSuffix(string(old), "\n") {
					old = append(old, '\n')
				}
				if err := os.WriteFile(requirements, append(old, []byte(line+"\n")...), 0o644); err != nil {
					return nil, err
				}
			}
			fmt.Fprintf(&b, "Added %s to requirements.txt; install it with `pip install -r requirements.txt`.\n", dep.GetPath())
		} else {
			fmt.Fprintf(&b, "Install the SDK into the program's Python environment: pip install -e %s\n", dep.GetPath())
		}
		fmt.Fprintf(&b, "Then use it in your program:\n\n    import %s as %s\n\n", module, pycodegen.PyName(name))
	}
	return &pulumirpc.LinkResponse{ImportInstructions: b.String()}, nil
}
